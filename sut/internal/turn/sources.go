package turn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// Bounds on loading one agent reference at start-up: a source that hangs or
// streams forever must not hold the server's start. The timeout is a
// variable only so that a test can show it without waiting 5 s.
var AgentFetchTimeout = 5 * time.Second

const maxAgentBytes = 64 << 10

// Why a conversation has no agent to run with. The server answers each
// with its own status (PROTOCOL.md, T8).
var (
	// errNoSource: no loaded source matches (404 not_found).
	errNoSource = errors.New("no loaded agent source")
	// errAmbiguousSource: several loaded sources match (409 conflict).
	errAmbiguousSource = errors.New("several loaded agent sources match")
	// errAgentNotFound: the exact-source-key-only mutant's miss (500).
	errAgentNotFound = errors.New("agent not found")
)

// agentSource is one agent loaded from a reference given at start-up.
type agentSource struct {
	// Key is the source key: the reference exactly as given. A
	// conversation records it with its first commit.
	Key string
	// stable is the stable key: for a URL, scheme://host/path, without
	// the query and fragment that a relaunch may change (a version tag);
	// for a file, its cleaned absolute path.
	stable string
	// name and instruction are the definition's.
	name        string
	instruction string
}

// agentDefinition is an agent definition as YAML. Unknown fields are
// refused: a misspelt "instructions" must fail the start, not run every
// conversation without its instruction.
type agentDefinition struct {
	Name        string `yaml:"name"`
	Instruction string `yaml:"instruction"`
}

// Sources are the agents a server loaded, in the order given.
type sources struct {
	// List are the sources loaded, in the order given.
	List []*agentSource
}

// LoadSources loads every reference: fetches a URL, reads a file, and
// parses the definition. The first that fails fails the whole load, with an
// error naming it.
func LoadSources(ctx context.Context, refs []string) (*sources, error) {
	s := &sources{}
	if len(refs) == 0 {
		return s, nil
	}
	// A client of its own, whose connections go with the load.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: AgentFetchTimeout}
	seen := map[string]bool{}
	for _, ref := range refs {
		if seen[ref] {
			return nil, fmt.Errorf("agent %q: given twice", ref)
		}
		seen[ref] = true
		src, err := loadSource(ctx, client, ref)
		if err != nil {
			return nil, fmt.Errorf("agent %q: %w", ref, err)
		}
		s.List = append(s.List, src)
	}
	return s, nil
}

// loadSource loads one reference.
func loadSource(ctx context.Context, client *http.Client, ref string) (*agentSource, error) {
	stable, isURL, err := stableKey(ref)
	if err != nil {
		return nil, err
	}
	var raw []byte
	if isURL {
		raw, err = fetchDefinition(ctx, client, ref)
	} else {
		raw, err = readDefinition(stable)
	}
	if err != nil {
		return nil, err
	}
	def, err := parseDefinition(raw)
	if err != nil {
		return nil, err
	}
	return &agentSource{Key: ref, stable: stable, name: def.Name, instruction: def.Instruction}, nil
}

// stableKey returns ref's stable key, and whether ref is a URL. A
// reference with "://" is a URL and must be http or https; anything else is
// a file path.
func stableKey(ref string) (string, bool, error) {
	if strings.TrimSpace(ref) == "" {
		return "", false, errors.New("an empty reference: want an http(s) URL or a file path")
	}
	if strings.Contains(ref, "://") {
		u, err := url.Parse(ref)
		if err != nil {
			return "", false, fmt.Errorf("not a URL: %v", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return "", false, fmt.Errorf("scheme %q: want http, https or a file path", u.Scheme)
		}
		if u.Host == "" {
			return "", false, errors.New("a URL without a host")
		}
		// The query and fragment are volatile as a whole (a version tag,
		// a cache buster): any of them may change across a relaunch.
		return u.Scheme + "://" + u.Host + u.EscapedPath(), true, nil
	}
	abs, err := filepath.Abs(ref)
	if err != nil {
		return "", false, err
	}
	return abs, false, nil // Abs cleans
}

// fetchDefinition GETs a definition, bounded in time and size.
func fetchDefinition(ctx context.Context, client *http.Client, ref string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ref, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch: answered %s", resp.Status)
	}
	return readBounded(resp.Body, "fetch")
}

// readDefinition reads a definition file, bounded in size.
func readDefinition(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, "read")
}

func readBounded(r io.Reader, what string) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxAgentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(raw) > maxAgentBytes {
		return nil, fmt.Errorf("%s: definition over %d bytes", what, maxAgentBytes)
	}
	return raw, nil
}

// parseDefinition reads one YAML document with a non-blank name and
// instruction, and no other field.
func parseDefinition(raw []byte) (agentDefinition, error) {
	var def agentDefinition
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&def); err != nil {
		if errors.Is(err, io.EOF) {
			return def, errors.New("parse: the definition is empty")
		}
		return def, fmt.Errorf("parse: %w", err)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return def, errors.New("parse: want one YAML document, got more")
	}
	switch {
	case strings.TrimSpace(def.Name) == "":
		return def, errors.New(`parse: "name" is required`)
	case strings.TrimSpace(def.Instruction) == "":
		return def, errors.New(`parse: "instruction" is required`)
	}
	return def, nil
}

// bind picks the source a new conversation runs with, by the request's
// model: a source key exactly, else the one source whose stable key it is,
// else the one agent of that name. Several at a level is errAmbiguousSource;
// none at all is errNoSource. With no sources loaded, nothing binds (nil).
func (s *sources) bind(model string) (*agentSource, error) {
	if len(s.List) == 0 {
		return nil, nil
	}
	if src := s.byKey(model); src != nil {
		return src, nil
	}
	levels := []struct {
		what  string
		match func(*agentSource) bool
	}{
		{"stable key", func(src *agentSource) bool { return src.stable == stableOf(model) }},
		{"name", func(src *agentSource) bool { return src.name == model }},
	}
	for _, l := range levels {
		switch found := s.filter(l.match); len(found) {
		case 0:
			continue
		case 1:
			return found[0], nil
		default:
			return nil, fmt.Errorf("%w: model %q matches the %s of %s; name one by its source key",
				errAmbiguousSource, model, l.what, keys(found))
		}
	}
	return nil, fmt.Errorf("%w for model %q: name an agent by its name or its source key (loaded: %s)",
		errNoSource, model, keys(s.List))
}

// resume picks the source a conversation that recorded key resumes with:
// that source if loaded, else the one loaded source with the same stable
// key. Several is errAmbiguousSource: never a silent pick. With exactOnly
// (the exact-source-key-only mutant) a miss is errAgentNotFound.
func (s *sources) resume(key string, exactOnly bool) (*agentSource, error) {
	if src := s.byKey(key); src != nil {
		return src, nil
	}
	if exactOnly {
		return nil, fmt.Errorf("%w: %s", errAgentNotFound, key)
	}
	stable := stableOf(key)
	switch found := s.filter(func(src *agentSource) bool { return src.stable == stable }); len(found) {
	case 0:
		return nil, fmt.Errorf("%w: the conversation was started under agent source %q, and neither it nor any source with its stable key %q is loaded",
			errNoSource, key, stable)
	case 1:
		return found[0], nil
	default:
		return nil, fmt.Errorf("%w: the conversation was started under agent source %q, which is not loaded, and %s share its stable key %q; nothing was changed: load only one of them",
			errAmbiguousSource, key, keys(found), stable)
	}
}

func (s *sources) byKey(key string) *agentSource {
	for _, src := range s.List {
		if src.Key == key {
			return src
		}
	}
	return nil
}

func (s *sources) filter(match func(*agentSource) bool) []*agentSource {
	var out []*agentSource
	for _, src := range s.List {
		if match(src) {
			out = append(out, src)
		}
	}
	return out
}

// stableOf is key's stable key, or "" if key is no valid reference (it
// then matches no source).
func stableOf(key string) string {
	stable, _, err := stableKey(key)
	if err != nil {
		return ""
	}
	return stable
}

// keys lists the source keys of srcs, quoted, in a stable order.
func keys(srcs []*agentSource) string {
	out := make([]string, len(srcs))
	for i, src := range srcs {
		out[i] = fmt.Sprintf("%q", src.Key)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// agentFor returns the agent source turn t on the committed conversation
// base runs with. A new conversation (nothing committed) binds by the
// request's model; one with committed messages resumes with the source it
// recorded, whatever the model says; one that recorded none (started with
// no agents loaded) stays unbound (nil). Under the mutants that bring
// docker-agent #3410 back, a resume takes an exact key or nothing: the
// recorded one, or, for a session turn whose path names a source key
// (docker-agent's shape), that one, as docker-agent looked it up.
func (s *Engine) agentFor(t *Turn, base *store.Conversation, model string) (*agentSource, error) {
	if len(base.Messages) == 0 {
		return s.Sources.bind(model)
	}
	if base.Source == "" {
		return nil, nil
	}
	exactOnly := s.exactSourceKeyOnly(t)
	if exactOnly && s.Cfg.Mutant == config.SessionExactSourceKey && strings.Contains(model, "://") {
		return s.Sources.resume(model, true)
	}
	return s.Sources.resume(base.Source, exactOnly)
}

// exactSourceKeyOnly reports whether turn t resumes only under the exact
// source key its conversation recorded: under exact-source-key-only for
// every turn, under session-exact-source-key for the sessions API's alone.
func (s *Engine) exactSourceKeyOnly(t *Turn) bool {
	switch s.Cfg.Mutant {
	case config.ExactSourceKeyOnly:
		return true
	case config.SessionExactSourceKey:
		return t.Proto == config.ProtoSessions
	}
	return false
}

// refuseAgent answers a turn that has no agent to run with.
func (s *Engine) refuseAgent(c Client, t *Turn, err error) {
	s.Log.Info("no agent for the turn; nothing changed", "conversation", t.Key.ID, "err", err)
	switch {
	case errors.Is(err, errAmbiguousSource):
		c.Refuse(admission.Refuse(http.StatusConflict, "conflict", err.Error()))
	case errors.Is(err, errNoSource):
		c.Refuse(admission.Refuse(http.StatusNotFound, "not_found", err.Error()))
	default:
		c.Refuse(admission.Refuse(http.StatusInternalServerError, "server_error", err.Error()))
	}
}
