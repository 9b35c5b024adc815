package admission

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
)

// What an HTTP turn request passes besides the gate every protocol's
// does: its key, its Content-Type and Content-Encoding, and its body,
// read within a size and a deadline.

// HTTPConfig is what the HTTP side of a Gate checks.
type HTTPConfig struct {
	// Keys, if any, are the bearer keys accepted; Scopes[i] is the scope
	// of Keys[i].
	Keys, Scopes []string
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes int64
	// BodyTimeout bounds reading a request's body.
	BodyTimeout time.Duration
}

// StatusClientClosed answers a request whose client went away (as
// nginx's 499): nobody may take it for a reply.
const StatusClientClosed = 499

// refuseEarly answers a request refused before its body was read, and
// closes its connection after the answer: what is left of the body is
// not worth waiting for.
func refuseEarly(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Connection", "close")
	openai.WriteError(w, status, typ, msg)
}

// AdmitHTTP takes a turn request through what every turn endpoint checks
// before it judges the body: the key, the Content-Type and
// Content-Encoding, the server's deliberate delay, the body's size and
// deadline, and a request slot. check, if not nil, judges the request's
// headers before its body is read (chat's conversation header). serve
// runs with the key's scope and the body, holding the slot, which is given
// back when it returns; a request refused on the way is answered here.
func (g *Gate) AdmitHTTP(w http.ResponseWriter, r *http.Request, check func() error, serve func(scope string, body []byte)) {
	scope, ok := g.authorize(r)
	if !ok {
		refuseEarly(w, http.StatusUnauthorized, "unauthorized", "missing or unknown API key: send Authorization: Bearer <key>")
		return
	}
	if err := checkContentType(r); err != nil {
		refuseEarly(w, http.StatusUnsupportedMediaType, "invalid_request_error", err.Error())
		return
	}
	if ce := r.Header.Values("Content-Encoding"); len(ce) > 0 && !(len(ce) == 1 && strings.EqualFold(strings.TrimSpace(ce[0]), "identity")) {
		// A compressed body read as plain would be garbage at best.
		refuseEarly(w, http.StatusUnsupportedMediaType, "invalid_request_error",
			fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed", strings.Join(ce, ", ")))
		return
	}
	// The body's cost is reserved before a byte of it is read: by its
	// Content-Length, or by the limit when it has none (chunked).
	declared := g.http.MaxBodyBytes
	if r.ContentLength >= 0 {
		declared = r.ContentLength
	}
	var body []byte
	release, refusal := TicketOf(r.Context()).Admit(r.Context(), func() *Refusal {
		if r.ContentLength > g.http.MaxBodyBytes {
			// Refused on its word, before a byte of it is read.
			return Refuse(http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("request body over %d bytes", g.http.MaxBodyBytes)).Early()
		}
		if check != nil {
			if err := check(); err != nil {
				return Refuse(http.StatusBadRequest, "invalid_request_error", err.Error()).Early()
			}
		}
		return nil
	}, declared, func() (int64, *Refusal) {
		var err error
		body, err = g.readBody(w, r)
		if err != nil {
			var tooLarge *http.MaxBytesError
			switch {
			case errors.As(err, &tooLarge):
				return 0, Refuse(http.StatusRequestEntityTooLarge, "request_too_large",
					fmt.Sprintf("request body over %d bytes", g.http.MaxBodyBytes)).Early()
			case errors.Is(err, errBodyTimeout):
				return 0, Refuse(http.StatusRequestTimeout, "request_timeout",
					fmt.Sprintf("the request body did not arrive within %s", g.http.BodyTimeout)).Early()
			default:
				return 0, Refuse(http.StatusBadRequest, "invalid_request_error", "the request body could not be read").Early()
			}
		}
		// The request is in: from here a turn runs on its connection, which a
		// crowd of new ones must not evict.
		if !ConnOf(r.Context()).Work() {
			return 0, ClientGone(false)
		}
		return declared - int64(len(body)), nil
	})
	if refusal != nil {
		refusal.Write(w)
		return
	}
	defer release()
	serve(scope, body)
}

// authorize returns the request's key scope, or false if keys are required
// and the request has no valid one.
func (g *Gate) authorize(r *http.Request) (string, bool) {
	if len(g.http.Keys) == 0 {
		return "", true
	}
	auth := r.Header.Values("Authorization")
	if len(auth) != 1 {
		// None, or two: which one a front checked is anyone's guess.
		return "", false
	}
	// The scheme name is case-insensitive (RFC 9110); the key is not.
	scheme, got, ok := strings.Cut(auth[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	for i, k := range g.http.Keys {
		if subtle.ConstantTimeCompare([]byte(got), []byte(k)) == 1 {
			return g.http.Scopes[i], true
		}
	}
	return "", false
}

// errBodyTimeout is a body that did not arrive within BodyTimeout.
var errBodyTimeout = errors.New("request body timed out")

// checkContentType refuses a body that says it is not JSON. A missing
// Content-Type is let through: a browser's POST always carries an Origin,
// which checkOrigin judges, and OpenAI-compatible clients that leave the
// header out still get served. A present one that is not application/json
// (text/plain, a form) is what a browser's simple request sends.
func checkContentType(r *http.Request) error {
	vals := r.Header.Values("Content-Type")
	if len(vals) == 0 {
		return nil
	}
	if len(vals) > 1 {
		return errors.New("more than one Content-Type header; send Content-Type: application/json")
	}
	mt, _, err := mime.ParseMediaType(vals[0])
	if err != nil || mt != "application/json" {
		return fmt.Errorf("Content-Type %.64q: send Content-Type: application/json", vals[0])
	}
	return nil
}

// readBody reads the request's body, within MaxBodyBytes and the body
// deadline ServeHTTP set. Once the whole body is in, it lifts that
// deadline: from then on the connection's only read is net/http's watch
// for the client going away, which must last as long as the turn does.
// Its error is an *http.MaxBytesError, errBodyTimeout, or the read's.
func (g *Gate) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.http.MaxBodyBytes))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, errBodyTimeout
	}
	if err != nil {
		return nil, err
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	return body, nil
}

// ClientGone answers a request whose client went away; kept says
// whether the interrupted turn committed its completed tool rounds. Nobody
// reads it, but a half-closed client that still does must not take
// silence for success.
func ClientGone(kept bool) *Refusal {
	msg := "the client closed the request; the turn was rolled back"
	if kept {
		msg = "the client closed the request; the turn was kept up to its last completed tool round, without a reply"
	}
	return Refuse(StatusClientClosed, "client_closed_request", msg)
}
