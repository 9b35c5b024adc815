package turn

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// What the model says when it fails (its error body, an address it could
// not reach) is for the server's operator, not its clients: it may name an
// internal host or quote a credential back ("Incorrect API key provided:
// sk-live-..."). Clients get a fixed message by status class; the details
// go to the server's log, through a redactor.

// Fixed messages of a failed model call.
const (
	msgModelFailed   = "the model failed"
	msgModelTimedOut = "the model timed out"
)

// Patterns of credentials in free text, each replaced by its template.
var credentialPatterns = []struct {
	re   *regexp.Regexp
	with string
}{
	// user:password@ (or a token as user name) in any URL.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s"'<>]+@`), "${1}[redacted]@"},
	// Authorization header values.
	{regexp.MustCompile(`(?i)\b(bearer|basic)(\s+)[a-z0-9._~+/=-]+`), "${1}${2}[redacted]"},
	// API keys of the sk-/rk-/pk- family (OpenAI, Anthropic, Stripe...).
	{regexp.MustCompile(`\b(sk|rk|pk)[-_][A-Za-z0-9_-]{6,}`), "[redacted]"},
	// Query parameters that carry credentials under short names.
	{regexp.MustCompile(`(?i)([?&](?:key|sig|signature|code|auth)=)[^&\s"'#]+`), "${1}[redacted]"},
	// Key=value and "key": "value" for names that hold secrets, in query
	// strings, headers and JSON.
	{regexp.MustCompile(`(?i)((?:api[-_]?key|access[-_]?token|auth[-_]?token|token|secret|password|passwd|authorization|x-api-key)"?\s*[:=]\s*"?)[^\s"&,;}]+`), "${1}[redacted]"},
	// Free text after a password, to the end of its line: "login failed
	// for password hunter2" names no key a pattern above would know.
	{regexp.MustCompile(`(?i)\b(pass(?:word|wd|phrase))\b[^\n]*`), "${1} [redacted]"},
	// Any URL: an upstream's error may name its internal hosts and paths,
	// which are its operator's business, not this server's log's.
	{regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.-]*://[^\s"'<>]+`), "[redacted]"},
}

// redactor hides credentials in text bound for the log: the patterns above,
// and the secrets the server was configured with.
type redactor struct {
	secrets []string
}

// minSecretLen is the shortest configured secret replaced wherever it
// occurs: a shorter one would blot out ordinary words.
const minSecretLen = 4

// NewRedactor returns the redactor of a server with keys and modelURL: it
// hides both, and the credentials a model's error may carry.
func NewRedactor(keys []string, modelURL *url.URL) *redactor {
	r := &redactor{}
	add := func(s string) {
		if len(s) >= minSecretLen {
			r.secrets = append(r.secrets, s)
		}
	}
	for _, k := range keys {
		add(k)
	}
	if u := modelURL.User; u != nil {
		add(u.Username())
		if p, ok := u.Password(); ok {
			add(p)
		}
	}
	return r
}

// Redact returns s with every credential it can spot replaced.
func (r *redactor) Redact(s string) string {
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, "[redacted]")
	}
	for _, p := range credentialPatterns {
		s = p.re.ReplaceAllString(s, p.with)
	}
	return s
}

// ParseModelURL parses and checks a model provider's base URL: http or
// https, with a host. Its errors never show the URL's user info.
func ParseModelURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("a model URL is required")
	}
	shown := hideUserinfo(raw)
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its URL would show the user info
		}
		return nil, fmt.Errorf("model URL %q: %s", shown, hideUserinfo(err.Error()))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("model URL %q: want an http:// or https:// URL", shown)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, fmt.Errorf("model URL %q: no host (want http://HOST[:PORT]/PATH)", shown)
	case u.Fragment != "" || strings.HasSuffix(raw, "#"):
		return nil, fmt.Errorf("model URL %q: a base URL has no #fragment", shown)
	}
	return u, nil
}

// hideUserinfo returns raw, a URL or what was meant as one, with whatever
// precedes an '@' in its authority replaced: however malformed the URL,
// no user name or password in it is shown.
func hideUserinfo(raw string) string {
	prefix, rest := "", raw
	if i := strings.Index(raw, "://"); i >= 0 {
		prefix, rest = raw[:i+3], raw[i+3:]
	}
	end := strings.IndexAny(rest, "?#")
	if end < 0 {
		end = len(rest)
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		rest = "[redacted]@" + rest[at+1:]
	}
	return prefix + rest
}
