// Package targets starts the servers a run checks, and says how they are
// reached and what they declare: a Remote server already running, a
// Handler, a Subprocess from a command line, or any of them from a YAML
// profile (LoadProfile). Only this package, and scenarios/reference for
// the in-repo server, know how a server is started.
package targets

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
)

// Eviction is what a server declares becomes of a conversation its cache
// evicts, or a restart drops (PROTOCOL.md, "Profiles").
type Eviction string

// The eviction policies.
const (
	// Durable: an evicted conversation is reloaded whole from storage.
	Durable Eviction = "durable"
	// Forgets: a cache-only server loses an evicted conversation whole;
	// it starts over empty, never half.
	Forgets Eviction = "forgets"
)

// Interruption is what a server declares it does with a turn whose client
// disconnected (PROTOCOL.md T10).
type Interruption string

// The interruption policies.
const (
	// Rollback: the interrupted turn leaves nothing behind.
	Rollback Interruption = "rollback"
	// KeepConsistent: completed tool pairs may be kept, as a prefix that
	// keeps every tool call paired with its result.
	KeepConsistent Interruption = "keep-consistent"
	// Complete: the turn runs on to its end and is committed whole, or
	// not at all, as a turn with an unknown outcome is (T6); only a part
	// of it kept is T10's.
	Complete Interruption = "complete"
)

// Durability says whether a server declares that committed turns survive
// a graceful restart, and a crash (kill -9).
type Durability struct {
	Restart bool `yaml:"restart"`
	Crash   bool `yaml:"crash"`
}

// profileFile is a profile as written in YAML. Every field is documented
// in profiles/README.md, with an example; LoadProfile refuses a field it
// does not know, naming it.
type profileFile struct {
	Server    *serverSection `yaml:"server"`
	URL       string         `yaml:"url"`
	ModelAddr string         `yaml:"model_addr"`

	Protocol           string        `yaml:"protocol"`
	Sessions           *SessionsAPI  `yaml:"sessions"`
	Responses          *ResponsesAPI `yaml:"responses"`
	ACP                *acpSection   `yaml:"acp"`
	A2A                *A2AAPI       `yaml:"a2a"`
	ConversationHeader string        `yaml:"conversation_header"`
	Keys               []string      `yaml:"keys"`
	Model              string        `yaml:"model"`
	ModelTimeout       time.Duration `yaml:"model_timeout"`
	ClientTimeout      time.Duration `yaml:"client_timeout"`
	Tools              bool          `yaml:"tools"`
	Policies           policySection `yaml:"policies"`
	Baseline           string        `yaml:"baseline"`
}

type serverSection struct {
	Command       []string          `yaml:"command"`
	Env           map[string]string `yaml:"env"`
	Files         map[string]string `yaml:"files"`
	Agent         string            `yaml:"agent"`
	AgentHost     string            `yaml:"agent_host"`
	AgentDef      string            `yaml:"agent_definition"`
	OneSource     bool              `yaml:"one_source"`
	Ready         readySection      `yaml:"ready"`
	StopGrace     time.Duration     `yaml:"stop_grace"`
	StopStatus    []int             `yaml:"stop_status"`
	StartTries    *int              `yaml:"start_tries"`
	FreshPerCheck bool              `yaml:"fresh_per_check"`
	Parallel      int               `yaml:"parallel"`
	RestartShare  float64           `yaml:"restart_share"`
	Replicas      int               `yaml:"replicas"`
	Store         string            `yaml:"store"`
	Front         *frontSection     `yaml:"front"`
}

// acpSection is what the harness advertises to an ACP agent.
type acpSection struct {
	ClientCapabilities ACPCapabilities `yaml:"client_capabilities"`
}

type frontSection struct {
	URL       string   `yaml:"url"`
	Upstreams []string `yaml:"upstreams"`
}

type readySection struct {
	HTTP    string        `yaml:"http"`
	Line    string        `yaml:"line"`
	Timeout time.Duration `yaml:"timeout"`
}

type policySection struct {
	Concurrency   string        `yaml:"concurrency"`
	QueueTimeout  time.Duration `yaml:"queue_timeout"`
	TakeoverAfter time.Duration `yaml:"takeover_after"`
	Eviction      string        `yaml:"eviction"`
	Capacity      int           `yaml:"capacity"`
	Interruption  string        `yaml:"interruption"`
	Durability    Durability    `yaml:"durability"`
}

// protocol sets p's protocol from the profile's.
func (f *profileFile) protocol(p *Profile) error {
	if f.Responses != nil && Protocol(f.Protocol) != Responses {
		return fmt.Errorf("responses: declares a Responses API server's semantics, but the protocol is %s", cmp.Or(f.Protocol, string(Chat)))
	}
	switch Protocol(f.Protocol) {
	case "", Chat:
		p.Protocol = Chat
	case Responses:
		p.Protocol = Responses
		if f.Responses != nil {
			if err := f.Responses.check(); err != nil {
				return fmt.Errorf("responses.%w", err)
			}
			p.ResponsesAPI = f.Responses
		}
	case ACP:
		p.Protocol = ACP
		if f.ACP != nil {
			p.ACPCaps = f.ACP.ClientCapabilities
		}
		if f.Sessions != nil {
			return errors.New("sessions: describes a session API, but the protocol is acp")
		}
		return f.acpFits()
	case A2A:
		p.Protocol = A2A
		api := f.A2A
		if api == nil {
			api = &A2AAPI{}
		}
		if err := api.check(); err != nil {
			return fmt.Errorf("a2a.%w", err)
		}
		p.A2AAPI = api
		if f.Sessions != nil || f.ACP != nil {
			return errors.New("sessions and acp: describe other protocols, but the protocol is a2a")
		}
		if f.ConversationHeader != "" {
			return errors.New("conversation_header: an A2A agent names a conversation by its contextId, not a header")
		}
		return nil
	case Sessions:
		p.Protocol = Sessions
		if f.Sessions == nil {
			return errors.New("sessions: the sessions protocol needs the session API described (create, id, turn, events)")
		}
		if err := f.Sessions.check(); err != nil {
			return fmt.Errorf("sessions.%w", err)
		}
		p.SessionsAPI = f.Sessions
		return nil
	default:
		if _, err := ParseProtocol(string(f.Protocol)); err != nil {
			return fmt.Errorf("protocol: %w", err)
		}
		return fmt.Errorf("protocol: %q is not one a profile can name yet", f.Protocol)
	}
	if f.ACP != nil {
		return fmt.Errorf("acp: says what the harness advertises to an ACP agent, but the protocol is %s", p.Protocol)
	}
	if f.A2A != nil {
		return fmt.Errorf("a2a: says what an A2A agent declares, but the protocol is %s", p.Protocol)
	}

	if f.Sessions != nil {
		return fmt.Errorf("sessions: describes a session API, but the protocol is %s", p.Protocol)
	}
	return nil
}

// acpFits says what of the profile an agent over stdio cannot have: it is
// started by the harness (no url), one process, reached through its
// stdin and stdout (no address, no ready probe, no header, no keys).
func (f *profileFile) acpFits() error {
	switch {
	case f.URL != "":
		return errors.New("url: an ACP agent speaks over the stdio of a process the harness starts: give server.command")
	case len(f.Keys) > 0:
		return errors.New("keys: an ACP agent over stdio has one client, and no API keys")
	case f.ConversationHeader != "":
		return errors.New("conversation_header: an ACP agent names a conversation by its sessionId, not a header")
	case f.Server == nil:
		return nil
	case f.Server.Ready.HTTP != "" || f.Server.Ready.Line != "":
		return errors.New("server.ready: an ACP agent is ready once it answers initialize; give only server.ready.timeout")
	case f.Server.Replicas > 1 || f.Server.Front != nil || f.Server.Store != "":
		return errors.New("server.replicas, server.front and server.store: an ACP agent is one process over stdio")
	case f.Policies.Eviction == string(Forgets):
		return errors.New("policies.eviction: forgets is not checked over ACP (no session cache the harness can fill)")
	}
	return nil
}

// checkStore says what is wrong with server.store, nil if nothing.
func (s *serverSection) checkStore() error {
	uses := slicesContainsAny(s.Command, "{store_url}") || hasPlaceholder(s.Env, "{store_url}") || hasPlaceholder(s.Files, "{store_url}")
	switch {
	case s.Store == "":
		if uses {
			return errors.New("{store_url} in the server's command, env or files, and no store: say store: postgres, or the store's postgres:// URL")
		}
		return nil
	case !uses:
		return errors.New("no {store_url} in the command, env or files: the server must be told where its store is")
	case s.Store == "postgres":
		return nil
	}
	u, err := url.Parse(s.Store)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("%q: want postgres (a PostgreSQL the harness starts for the server) or a postgres:// URL", s.Store)
	}
	if !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("%q: turncheck talks to this machine only (127.0.0.1, ::1, localhost)", s.Store)
	}
	return nil
}

// sections names the YAML sections by their Go types, for errors about
// unknown fields.
var sections = map[string]reflect.Type{
	"the profile":                      reflect.TypeFor[profileFile](),
	"server":                           reflect.TypeFor[serverSection](),
	"server.ready":                     reflect.TypeFor[readySection](),
	"server.front":                     reflect.TypeFor[frontSection](),
	"policies":                         reflect.TypeFor[policySection](),
	"policies.durability":              reflect.TypeFor[Durability](),
	"sessions":                         reflect.TypeFor[SessionsAPI](),
	"responses":                        reflect.TypeFor[ResponsesAPI](),
	"sessions.create or sessions.turn": reflect.TypeFor[Call](),
	"sessions.events":                  reflect.TypeFor[EventRules](),
	"acp":                              reflect.TypeFor[acpSection](),
	"acp.client_capabilities":          reflect.TypeFor[ACPCapabilities](),
	"a2a":                              reflect.TypeFor[A2AAPI](),
}

// LoadProfile reads a YAML profile (see profiles/README.md): how to start
// a server, or where one runs, how to talk to it, and the policies it
// declares. It returns the Target the profile describes: a Subprocess, or
// a Remote for a fixed URL. The error names the file, the line and the
// field of anything the profile gets wrong, an unknown field included.
func LoadProfile(path string) (Target, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := ParseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseProfile is LoadProfile on the profile's text.
func ParseProfile(data []byte) (Target, error) {
	var f profileFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, yamlError(err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document: a profile is one")
	}
	return f.target()
}

var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type (\S+)`)

// yamlError rewords the decoder's errors for a person, on one line: which
// field of which section is unknown (and which fields that section has),
// and what kind of value was expected, in words rather than Go types.
func yamlError(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("empty profile")
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	lines := make([]string, len(te.Errors))
	for i, msg := range te.Errors {
		if m := unknownField.FindStringSubmatch(msg); m != nil {
			section, known := "the profile", ""
			for name, t := range sections {
				if strings.HasSuffix(m[3], "."+t.Name()) {
					section, known = name, fieldList(t)
				}
			}
			lines[i] = fmt.Sprintf("line %s: unknown field %q in %s (known: %s)", m[1], m[2], section, known)
			continue
		}
		lines[i] = goTypes.Replace(msg)
	}
	return errors.New(strings.Join(lines, "; "))
}

// goTypes names the Go types of decoding errors as a profile's author
// thinks of them.
var goTypes = strings.NewReplacer(
	"into time.Duration", "into a duration (e.g. 2s)",
	"into []string", "into a list of strings",
	"into map[string]string", "into a mapping of names to strings",
	"into bool", "into true or false",
	"into int", "into a whole number",
	"into string", "into a string",
	"into scenarios.profileFile", "into a profile (a mapping of fields)",
	"into scenarios.serverSection", "into server (a mapping of fields)",
	"into scenarios.readySection", "into server.ready (a mapping of fields)",
	"into scenarios.policySection", "into policies (a mapping of fields)",
	"into scenarios.Durability", "into policies.durability (a mapping of fields)",
)

func fieldList(t reflect.Type) string {
	var names []string
	for i := range t.NumField() {
		if tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" {
			names = append(names, tag)
		}
	}
	return strings.Join(names, ", ")
}

// target checks the profile's values and builds its Target.
func (f *profileFile) target() (Target, error) {
	p := Profile{Header: f.ConversationHeader, Keys: f.Keys, Model: f.Model, ModelTimeout: f.ModelTimeout, ClientTimeout: f.ClientTimeout, Tools: f.Tools,
		Baseline: f.Baseline}
	if f.Server != nil {
		if err := f.Server.agentSource(&p, f.ModelAddr); err != nil {
			return nil, err
		}
		if r := f.Server.RestartShare; r < 0 || r > 1 {
			return nil, fmt.Errorf("server.restart_share: %v is no share of the steps drawn: give one from 0 (excluded) to 1 (restarts never rationed, the default)", r)
		}
		p.RestartShare = f.Server.RestartShare
		if n := f.Server.StartTries; n != nil {
			if *n < 1 {
				return nil, fmt.Errorf("server.start_tries: %d: want how many times a start is tried before the server counts as not started, at least 1", *n)
			}
			p.StartTries = *n
		}
	}
	if p.Model == "" {
		p.Model = "turncheck"
		if p.Agent != "" {
			p.Model = p.Agent // a new conversation binds to its agent by name
		}
	}
	if f.ClientTimeout < 0 {
		return nil, errors.New("client_timeout: must not be negative")
	}
	if f.ClientTimeout > 0 && f.ModelTimeout > 0 && f.ClientTimeout <= f.ModelTimeout {
		return nil, errors.New("client_timeout: must be longer than model_timeout, or a held call's timeout would read as the server never answering")
	}
	if f.ModelTimeout < 0 {
		return nil, errors.New("model_timeout: must not be negative")
	}
	if p.Header != "" && !validHeader(p.Header) {
		return nil, fmt.Errorf("conversation_header: %q is not an HTTP header name", p.Header)
	}
	for i, k := range f.Keys {
		if k == "" || strings.ContainsAny(k, " \t\r\n") {
			return nil, fmt.Errorf("keys[%d]: a key is a non-empty token without spaces", i)
		}
	}
	if err := f.protocol(&p); err != nil {
		return nil, err
	}
	// After the protocol: which policies a server may declare depends on
	// it.
	if err := f.Policies.apply(&p); err != nil {
		return nil, fmt.Errorf("policies.%w", err)
	}
	if p.SessionsAPI != nil && p.SessionsAPI.NamesSource() && p.Agent == "" {
		return nil, errors.New("sessions: {source} names the agent source a session was started under, and the server loads none: say server.agent")
	}
	switch {
	case f.Server != nil && f.URL != "":
		return nil, errors.New("give either server (how to start it) or url (where it runs), not both")
	case f.URL != "":
		if err := checkLoopbackURL(f.URL); err != nil {
			return nil, fmt.Errorf("url: %w", err)
		}
		if f.ModelAddr == "" {
			return nil, errors.New("model_addr: a server at a fixed url was configured with a model URL already; say where the fake model must listen (e.g. 127.0.0.1:9090)")
		}
		if err := checkLoopbackAddr(f.ModelAddr); err != nil {
			return nil, fmt.Errorf("model_addr: %w", err)
		}
		if strings.HasSuffix(f.ModelAddr, ":0") {
			return nil, errors.New("model_addr: port 0 picks a port the running server cannot know; give the port its model URL names")
		}
		return Remote{URL: f.URL, ModelAt: f.ModelAddr, Reaches: p}, nil
	case f.Server != nil:
		return f.Server.subprocess(p, f.ModelAddr)
	}
	return nil, errors.New("no server: give server.command (how to start it) or url (where it runs)")
}

// agentSource sets p's agent source from the section: the agent, the host
// its references name, the definition the fake model serves, and whether
// the server loads one source at a time. modelAddr is where the fake model
// listens ("" for 127.0.0.1 on a free port).
func (s *serverSection) agentSource(p *Profile, modelAddr string) error {
	p.Agent, p.AgentHost, p.AgentDefinition, p.OneSource = s.Agent, s.AgentHost, s.AgentDef, s.OneSource
	if p.Agent != "" {
		if err := checkAgentHost(p.AgentHost, modelAddr); err != nil {
			return fmt.Errorf("server.agent_host: %w", err)
		}
		if p.AgentDefinition != "" {
			if err := faults.CheckAgentDefinition(p.AgentDefinition); err != nil {
				return fmt.Errorf("server.agent_definition: %w", err)
			}
		}
		return nil
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"one_source", p.OneSource}, {"agent_host", p.AgentHost != ""}, {"agent_definition", p.AgentDefinition != ""}} {
		if f.set {
			return fmt.Errorf("server.%s: the server loads no agent source (server.agent): say which agent it loads", f.name)
		}
	}
	return nil
}

// checkAgentHost says what is wrong with host as the host of the agent
// references, nil if nothing: "" (the fake model's address), localhost
// (for a server that loads plain-http sources only from localhost), or
// the IP the fake model listens on.
func checkAgentHost(host, modelAddr string) error {
	listens := "127.0.0.1"
	if modelAddr != "" {
		listens, _, _ = net.SplitHostPort(modelAddr)
	}
	if host == "" || host == "localhost" || host == listens {
		return nil
	}
	if ip, at := net.ParseIP(host), net.ParseIP(listens); ip != nil && at != nil && ip.Equal(at) {
		return nil
	}
	return fmt.Errorf("%q: want localhost, or %s, where the fake model listens (model_addr)", host, listens)
}

func (s *serverSection) subprocess(p Profile, modelAddr string) (Target, error) {
	if len(s.Command) == 0 || s.Command[0] == "" {
		return nil, errors.New("server.command: empty; give the command line as a list, e.g. [./myserver, --listen, \"{addr}\"]")
	}
	if !slicesContainsAny(s.Command, "{addr}", "{port}") && s.Ready.Line == "" && p.Protocol != ACP {
		return nil, errors.New("server.command: no {addr} or {port}, and no ready.line that reports the address: the server cannot learn where to listen, nor the harness where it listens")
	}
	if !slicesContainsAny(s.Command, "{model_url}") && !hasPlaceholder(s.Env, "{model_url}") && !hasPlaceholder(s.Files, "{model_url}") &&
		!strings.Contains(s.AgentDef, "{model_url}") {
		return nil, errors.New("server.command: no {model_url} in the command, env or files (nor in agent_definition): the server must call the fake model, at the URL the harness gives it")
	}
	for name, text := range s.Files {
		if err := faults.CheckFilePath(name); err != nil {
			return nil, fmt.Errorf("server.files: %q: %v", name, err)
		}
		if strings.Contains(text, "{agents}") {
			return nil, fmt.Errorf("server.files: %q: {agents} is for the command line (--agent={agents}), where it repeats per agent", name)
		}
	}
	if s.Ready.HTTP != "" && s.Ready.Line != "" {
		return nil, errors.New("server.ready: give http or line, not both")
	}
	if s.Ready.Line != "" {
		if _, err := regexp.Compile(s.Ready.Line); err != nil {
			return nil, fmt.Errorf("server.ready.line: %v", err)
		}
	}
	if s.Ready.Timeout < 0 || s.StopGrace < 0 || s.Parallel < 0 || s.Replicas < 0 {
		return nil, errors.New("server.ready.timeout, server.stop_grace, server.parallel and server.replicas must not be negative")
	}
	for _, st := range s.StopStatus {
		if st < 1 || st > 255 {
			return nil, fmt.Errorf("server.stop_status: %d is no exit status a server can give (1 to 255; 0 is always tidy)", st)
		}
	}
	if s.Agent != "" && !agentName.MatchString(s.Agent) {
		return nil, fmt.Errorf("server.agent: %q is not an agent name (letters, digits, - and _)", s.Agent)
	}
	if s.Agent != "" && !slicesContainsAny(s.Command, "{agents}") {
		return nil, errors.New("server.agent: no {agents} in the command: write --agent={agents} (or your server's flag) where its reference goes")
	}
	if modelAddr != "" {
		if err := checkLoopbackAddr(modelAddr); err != nil {
			return nil, fmt.Errorf("model_addr: %w", err)
		}
	}
	if err := s.checkStore(); err != nil {
		return nil, fmt.Errorf("server.store: %w", err)
	}
	var front *Front
	if s.Front != nil {
		front = &Front{URL: s.Front.URL, Upstreams: s.Front.Upstreams}
		if err := front.Check(s.Replicas); err != nil {
			return nil, fmt.Errorf("server.front.%w", err)
		}
		if s.Parallel > 1 {
			return nil, errors.New("server.parallel: a front sends to fixed addresses, which one server at a time can hold: say 1, or leave it out")
		}
		// The front's upstreams are one server's at a time.
		s.Parallel = 1
	}
	env := make([]string, 0, len(s.Env))
	for k, v := range s.Env {
		if k == "" || strings.Contains(k, "=") {
			return nil, fmt.Errorf("server.env: %q is not an environment variable name", k)
		}
		env = append(env, k+"="+v)
	}
	return Subprocess{
		Command:       s.Command,
		Env:           env,
		Files:         s.Files,
		Agent:         s.Agent,
		Ready:         s.Ready.HTTP,
		ReadyLine:     s.Ready.Line,
		StartTimeout:  s.Ready.Timeout,
		StopGrace:     s.StopGrace,
		StopStatus:    s.StopStatus,
		FreshPerCheck: s.FreshPerCheck,
		MaxParallel:   s.Parallel,
		Replicas:      s.Replicas,
		Store:         s.Store,
		Front:         front,
		ModelAt:       modelAddr,
		Reaches:       p,
	}, nil
}

func (ps policySection) apply(p *Profile) error {
	assume := func(policy, taken, others string) {
		if p.Assumed == nil {
			p.Assumed = map[string]string{}
		}
		p.Assumed[policy] = fmt.Sprintf("the profile declares no %s policy, so %s was assumed; %s", policy, taken, others)
	}
	if ps.Concurrency == "" {
		assume("concurrency", "serialize", "declare reject for a server that refuses a request on a busy conversation with 409")
	}
	if ps.Eviction == "" {
		assume("eviction", "durable", "declare forgets, with its capacity, for a cache-only server")
	}
	if ps.Interruption == "" {
		assume("interruption", "rollback", "the others are keep-consistent (the user message and completed tool pairs may stay) "+
			"and complete (the turn runs to its end whatever the client does)")
	}
	switch ps.Concurrency {
	case "", "serialize":
		p.Concurrency = model.Serialize
	case "reject":
		p.Concurrency = model.Reject
	case "supersede":
		if p.Protocol != ACP {
			return errors.New("concurrency: supersede (a new prompt cancels the running one) is an ACP agent's policy; want serialize or reject")
		}
		// Judged as serialize, but for the prompt superseded: an
		// interrupted turn (T10), not a turn given up unasked (T4).
		p.Concurrency, p.Supersede = model.Serialize, true
	default:
		return fmt.Errorf("concurrency: %q; want serialize, reject or (ACP) supersede", ps.Concurrency)
	}
	switch {
	case ps.QueueTimeout < 0:
		return errors.New("queue_timeout: must not be negative")
	case ps.QueueTimeout > 0 && p.Concurrency != model.Serialize:
		return errors.New("queue_timeout: bounds how long a serialized turn waits; a server that rejects a request on a busy conversation makes none wait")
	}
	p.QueueTimeout = ps.QueueTimeout
	if ps.TakeoverAfter < 0 {
		return errors.New("takeover_after: must not be negative")
	}
	p.TakeoverAfter = ps.TakeoverAfter
	switch Eviction(ps.Eviction) {
	case "", Durable:
		p.Eviction = Durable
	case Forgets:
		p.Eviction = Forgets
		if ps.Capacity <= 0 {
			return errors.New("capacity: a server that forgets evicted conversations must say how many it holds")
		}
	default:
		return fmt.Errorf("eviction: %q; want durable or forgets", ps.Eviction)
	}
	if p.Eviction == Forgets && (ps.Durability.Restart || ps.Durability.Crash) {
		return errors.New("durability: a server that forgets evicted conversations keeps none across a restart; declare eviction durable, or no durability")
	}
	if ps.Capacity < 0 {
		return errors.New("capacity: must not be negative")
	}
	p.Capacity = ps.Capacity
	switch Interruption(ps.Interruption) {
	case "", Rollback:
		p.Interruption = Rollback
	case KeepConsistent, Complete:
		p.Interruption = Interruption(ps.Interruption)
	default:
		return fmt.Errorf("interruption: %q; want rollback, keep-consistent or complete", ps.Interruption)
	}
	p.Durability = ps.Durability
	return nil
}

func slicesContainsAny(args []string, subs ...string) bool {
	for _, a := range args {
		for _, s := range subs {
			if strings.Contains(a, s) {
				return true
			}
		}
	}
	return false
}

// hasPlaceholder reports whether a value of m holds sub.
func hasPlaceholder(m map[string]string, sub string) bool {
	for _, v := range m {
		if strings.Contains(v, sub) {
			return true
		}
	}
	return false
}

var agentName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

var headerName = regexp.MustCompile(`^[!#$%&'*+\-.^_` + "`" + `|~0-9A-Za-z]+$`)

func validHeader(h string) bool { return headerName.MatchString(h) }

// checkLoopbackURL accepts an http URL on a loopback host: turncheck sends
// its traffic to this machine only.
func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want an http:// URL", raw)
	}
	if !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("%q: turncheck checks servers on this machine only (127.0.0.1, ::1 or localhost)", raw)
	}
	return nil
}

func checkLoopbackAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port", addr)
	}
	if !isLoopbackHost(host) {
		return fmt.Errorf("%q: turncheck listens on loopback only (127.0.0.1, ::1 or localhost)", addr)
	}
	if port == "" {
		return fmt.Errorf("%q: no port", addr)
	}
	return nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
