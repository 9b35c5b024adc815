package targets

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/model"
)

// TestReferenceProfile: the reference server's profile reads as the
// subprocess target it describes.
func TestReferenceProfile(t *testing.T) {
	target, err := LoadProfile("../../profiles/reference.yaml")
	require.NoError(t, err)
	s, ok := target.(Subprocess)
	require.True(t, ok, "%T", target)
	assert.Equal(t, []string{"turncheck", "serve", "--listen", "{addr}"}, s.Command[:4])
	assert.True(t, s.ReuseServer())
	assert.Equal(t, `listening on (http://\S+)`, s.ReadyLine, "the server picks its port and says where")
	assert.Equal(t, 15*time.Second, s.StartTimeout)
	p := s.Profile()
	assert.Equal(t, []string{"key-a", "key-b"}, p.Keys)
	assert.Equal(t, model.Serialize, p.Concurrency)
	assert.Equal(t, time.Second, p.ModelTimeout)
	assert.Equal(t, Durability{Restart: true, Crash: true}, p.Durability)
	assert.Equal(t, Durable, p.Eviction)
	assert.Equal(t, Rollback, p.Interruption)
	assert.True(t, p.Tools)
}

// TestProfileFields: every field reaches the target, and a fixed URL
// makes a Remote.
func TestProfileFields(t *testing.T) {
	target, err := ParseProfile([]byte(`
server:
  command: [./srv, "--port={port}", "--agent={agents}"]
  env: {OPENAI_BASE_URL: "{model_url}"}
  files: {conf/model.yaml: "base_url: {model_url}\n"}
  agent: helper
  ready: {line: 'listening on (\S+)', timeout: 1m}
  stop_grace: 2s
  fresh_per_check: true
model_addr: 127.0.0.1:9999
conversation_header: x-session
keys: [k1]
model: agent
model_timeout: 3s
client_timeout: 3m
tools: true
policies:
  concurrency: reject
  eviction: forgets
  capacity: 10
  interruption: keep-consistent
`))
	require.NoError(t, err)
	s := target.(Subprocess)
	assert.Equal(t, []string{"OPENAI_BASE_URL={model_url}"}, s.Env)
	assert.Equal(t, map[string]string{"conf/model.yaml": "base_url: {model_url}\n"}, s.Files)
	assert.Equal(t, "helper", s.Agent)
	assert.Equal(t, `listening on (\S+)`, s.ReadyLine)
	assert.Equal(t, time.Minute, s.StartTimeout)
	assert.Equal(t, 2*time.Second, s.StopGrace)
	assert.False(t, s.ReuseServer())
	assert.Equal(t, "127.0.0.1:9999", s.ModelAddr())
	p := s.Profile()
	assert.Equal(t, Profile{Protocol: Chat, Header: "x-session", Keys: []string{"k1"}, Model: "agent", Concurrency: model.Reject,
		ModelTimeout: 3 * time.Second, ClientTimeout: 3 * time.Minute, Eviction: Forgets, Capacity: 10, Interruption: KeepConsistent,
		Agent: "helper", Tools: true}, p)
	assert.Equal(t, 3*time.Minute, p.RequestTimeout(), "the client waits as long as declared, apart from the model timeout")
	assert.Equal(t, 3*time.Second, p.QueueTimeoutOrDefault(), "a serialized wait is bounded as a model call is, unless declared apart")

	// The bound on a serialized turn's wait, apart from the model
	// timeout: openclaw's real model timeout is long, and its refusals of
	// a concurrent first request (#84575) come at once.
	target, err = ParseProfile([]byte("server: {command: [./srv, '{addr}', '{model_url}']}\nmodel_timeout: 2m\npolicies: {queue_timeout: 10m}\n"))
	require.NoError(t, err)
	p = target.Profile()
	assert.Equal(t, 2*time.Minute, p.ModelTimeoutOrDefault())
	assert.Equal(t, 10*time.Minute, p.QueueTimeoutOrDefault())
	assert.Zero(t, p.TakeoverAfter, "undeclared: a conversation is free the moment its server is back")

	// Replicas that wait out a silent peer before they take its
	// conversations over.
	target, err = ParseProfile([]byte("server: {command: [./srv, '{addr}', '{model_url}']}\npolicies: {takeover_after: 3s}\n"))
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, target.Profile().TakeoverAfter)

	target, err = ParseProfile([]byte(front(`{url: "http://127.0.0.1:8080", upstreams: ["127.0.0.1:9701", "[::1]:9702"]}`)))
	require.NoError(t, err)
	s = target.(Subprocess)
	assert.Equal(t, &Front{URL: "http://127.0.0.1:8080", Upstreams: []string{"127.0.0.1:9701", "[::1]:9702"}}, s.Front)
	assert.Equal(t, 1, s.MaxParallel, "fixed upstreams: one server at a time")

	target, err = ParseProfile([]byte("url: http://127.0.0.1:8080\nmodel_addr: '[::1]:9090'\n"))
	require.NoError(t, err)
	r := target.(Remote)
	assert.Equal(t, "http://127.0.0.1:8080", r.URL)
	assert.Equal(t, "[::1]:9090", r.ModelAddr())
	assert.True(t, r.ReuseServer())
	assert.Equal(t, "turncheck", r.Profile().Model)
}

// TestProfileErrors: a profile that gets something wrong is refused with
// an error that names what, never a panic.
func TestProfileErrors(t *testing.T) {
	cmd := "server: {command: [./srv, '{addr}', '{model_url}']}\n"
	for yaml, want := range map[string]string{
		"":                                                                    "empty profile",
		"serverr: {}\n":                                                       `unknown field "serverr" in the profile`,
		"server: {comand: [x]}\n":                                             `unknown field "comand" in server (known: command, env`,
		cmd + "policies: {concurency: reject}":                                `unknown field "concurency" in policies`,
		"server: {ready: {htp: /h}}\n":                                        `unknown field "htp" in server.ready`,
		cmd + "policies: {concurrency: maybe}":                                `policies.concurrency: "maybe"`,
		cmd + "policies: {eviction: forgets}":                                 "policies.capacity",
		cmd + "policies: {interruption: x}":                                   "policies.interruption",
		cmd + "model_timeout: soon":                                           "line 2",
		cmd + "model_timeout: 5s\nclient_timeout: 5s":                         "client_timeout: must be longer",
		cmd + "policies: {queue_timeout: -1s}":                                "queue_timeout: must not be negative",
		cmd + "policies: {takeover_after: -1s}":                               "takeover_after: must not be negative",
		cmd + "policies: {concurrency: reject, queue_timeout: 5s}":            "queue_timeout: bounds how long a serialized turn waits",
		cmd + "keys: ['a b']":                                                 "keys[0]",
		cmd + "conversation_header: 'a b'":                                    "conversation_header",
		cmd + "url: http://127.0.0.1:1":                                       "not both",
		"server: {command: []}\n":                                             "server.command: empty",
		"server: {command: [./srv, '{model_url}']}\n":                         "no {addr} or {port}",
		"server: {command: [./srv, '{addr}']}\n":                              "no {model_url}",
		cmd + "server: {command: [x]}":                                        "",
		"server: {command: [x, '{addr}', '{model_url}'], ready: {line: '('}}": "server.ready.line",
		"url: http://127.0.0.1:8080\n":                                        "model_addr",
		"url: http://example.com\nmodel_addr: 127.0.0.1:1\n":                  "this machine only",
		"url: http://127.0.0.1:1\nmodel_addr: 10.0.0.1:1\n":                   "loopback only",
		"model: x\n":        "no server",
		"- a\n- b\n":        "cannot unmarshal",
		cmd + "---\n" + cmd: "more than one YAML document",
		"server: {command: [x, '{addr}', '{model_url}'], env: {'A=B': c}}":          "server.env",
		"server: {command: [x, '{addr}', '{model_url}'], agent: helper}":            "no {agents}",
		"server: {command: [x, '{addr}', '{model_url}', '{agents}'], agent: 'a b'}": "server.agent",
		"server: {command: [x, '{addr}', '{model_url}'], one_source: true}":         "server.one_source: the server loads no agent source",
		"server: {command: [x, '{addr}', '{model_url}'], files: {../c.json: x}}":    `server.files: "../c.json": the path leaves the data dir`,
		"server: {command: [x, '{addr}', '{model_url}'], files: {/etc/c: x}}":       `server.files: "/etc/c": want a path relative`,
		"server: {command: [x, '{addr}', '{model_url}'], files: {c: '{agents}'}}":   `server.files: "c": {agents} is for the command line`,
		"server: {command: [x, '{addr}'], files: {c.json: '{addr}'}}":               "no {model_url} in the command, env or files",
		cmd + "protocol: grpc":                                                                                           `protocol: "grpc"; want chat, responses, sessions, acp or a2a`,
		cmd + "protocol: a2a\na2a: {context_ids: both}":                                                                  `a2a.context_ids: "both"; want server or client`,
		cmd + "protocol: a2a\na2a: {dropped_stream: ignored}":                                                            `a2a.dropped_stream: "ignored"; want runs-on or cancels`,
		cmd + "protocol: a2a\na2a: {path: invoke}":                                                                       `a2a.path: "invoke" must start with /`,
		cmd + "protocol: a2a\nconversation_header: X-C":                                                                  "conversation_header: an A2A agent names a conversation by its contextId",
		cmd + "a2a: {path: /invoke}":                                                                                     "a2a: says what an A2A agent declares, but the protocol is chat",
		cmd + "protocol: sessions":                                                                                       "sessions: the sessions protocol needs the session API described",
		cmd + "protocol: chat\nsessions: {id: id}":                                                                       "sessions: describes a session API, but the protocol is chat",
		cmd + "protocol: sessions\nsessions: {bogus: 1}":                                                                 `unknown field "bogus" in sessions`,
		cmd + "protocol: sessions\nsessions: {turn: {verb: x}}":                                                          `unknown field "verb" in sessions.create or sessions.turn`,
		cmd + sessions(`create: {method: GET, path: /s}`):                                                                "sessions.create.method",
		cmd + sessions(`turn: {path: /t, body: '{messages}'}`):                                                           "sessions.turn.path: must contain {session}",
		cmd + sessions(`turn: {path: '/t/{session}', body: '{}'}`):                                                       "sessions.turn.body: must contain {message} or {messages}",
		cmd + sessions(`events: {text: t, text_field: c}`):                                                               "sessions.events.done",
		cmd + sessions(`create: {path: s}`):                                                                              "sessions.create.path",
		cmd + sessions(`id: ""`):                                                                                         "sessions.id",
		cmd + sessions(`events: {done: [ok], text_field: c}`):                                                            "sessions.events.text",
		front(`{url: "http://127.0.0.1:80", upstreams: [127.0.0.1:1]}`):                                                  "server.front.upstreams: 1 address(es) for 2 replicas",
		front(`{url: "http://10.1.1.1:80", upstreams: [127.0.0.1:1, 127.0.0.1:2]}`):                                      "server.front.url",
		front(`{url: "http://127.0.0.1:80", upstreams: [127.0.0.1:1, 10.0.0.1:2]}`):                                      "server.front.upstreams: \"10.0.0.1:2\": turncheck listens on loopback only",
		front(`{url: "http://127.0.0.1:80", upstreams: [127.0.0.1:1, 127.0.0.1:1]}`):                                     "127.0.0.1:1 twice",
		front(`{url: "http://127.0.0.1:80", upstream: [127.0.0.1:1]}`):                                                   `unknown field "upstream" in server.front`,
		front(`{url: "http://127.0.0.1:80", upstreams: [127.0.0.1:1, 127.0.0.1:2]}, parallel: 2`):                        "server.parallel",
		"server: {command: [x, '{addr}', '{model_url}'], front: {url: 'http://127.0.0.1:80', upstreams: [127.0.0.1:1]}}": "two replicas or more",

		// The agent source a server loads from the fake model.
		"server: {command: [x, '{addr}', '{model_url}'], agent_host: localhost}":          "server.agent_host: the server loads no agent source",
		"server: {command: [x, '{addr}', '{model_url}'], agent_definition: 'a: b'}":       "server.agent_definition: the server loads no agent source",
		agent("agent_host: example.com"):                                                  `server.agent_host: "example.com": want localhost, or 127.0.0.1, where the fake model listens`,
		agent("agent_host: 127.0.0.2"):                                                    `server.agent_host: "127.0.0.2"`,
		agent("agent_host: 127.0.0.1") + "model_addr: '[::1]:9090'\n":                     `where the fake model listens`,
		agent("agent_definition: ' '"):                                                    "server.agent_definition: empty",
		agent("agent_definition: 'base_url: {model}'"):                                    "server.agent_definition: unknown placeholder {model} (known: {model_url}",
		cmd + sessions(`turn: {path: '/s/{session}/agent/{source}', body: '{messages}'}`): "sessions: {source} names the agent source a session was started under, and the server loads none",
		cmd + sessions(`create: {path: /s, body: '{"agent": {source}}'}`):                 "{source} names the agent source",
	} {
		_, err := ParseProfile([]byte(yaml))
		require.Error(t, err, "%q", yaml)
		assert.Contains(t, err.Error(), want, "%q", yaml)
		assert.NotContains(t, err.Error(), "scenarios.", "no Go type names: %q", yaml)
		assert.False(t, strings.Contains(err.Error(), "\n"), "one line: %q", err)
	}
	if lo, hi, known := loopback.EphemeralPorts(); known {
		_, err := ParseProfile([]byte(front(fmt.Sprintf(`{url: "http://127.0.0.1:80", upstreams: [127.0.0.1:1, "127.0.0.1:%d"]}`, (lo+hi)/2))))
		assert.ErrorContains(t, err, "range for outgoing connections", "an upstream a connection may take while a replica restarts")
	}
	_, err := LoadProfile("no-such-profile.yaml")
	assert.ErrorContains(t, err, "no-such-profile.yaml")
}

// agent is a server that loads the agent helper from the fake model, with
// the fields of server in fields (a YAML flow mapping's, without braces).
func agent(fields string) string {
	return "server: {command: [x, '{addr}', '{model_url}', '{agents}'], agent: helper, " + fields + "}\n"
}

// front is a server of two replicas behind the front f (a YAML flow
// mapping, and any fields of server that follow it).
func front(f string) string {
	return "server: {command: [x, '{addr}', '{model_url}'], replicas: 2, front: " + f + "}\n"
}

// sessions is a sessions protocol section, valid but for the field
// override replaces.
func sessions(override string) string {
	fields := map[string]string{
		"create": "{path: /s}",
		"id":     "id",
		"turn":   "{path: '/s/{session}', body: '{messages}'}",
		"events": "{text: t, text_field: c, done: [ok]}",
	}
	name, value, _ := strings.Cut(override, ": ")
	fields[name] = value
	out := "protocol: sessions\nsessions:\n"
	for _, k := range []string{"create", "id", "turn", "events"} {
		out += "  " + k + ": " + fields[k] + "\n"
	}
	return out
}

// TestSessionsInput: a session API appends a turn's messages unless its
// profile says the last is the new one; either way the client sends the
// continuations without a new user message that such a server must take
// (AppendsInput), and anything else is an error that names the values.
func TestSessionsInput(t *testing.T) {
	cmd := "server: {command: [x, '{addr}', '{model_url}']}\n"
	for input, appends := range map[string]bool{"": true, "\n  input: appended": true, "\n  input: last": false} {
		target, err := ParseProfile([]byte(cmd + strings.TrimSuffix(sessions(""), "\n") + input + "\n"))
		require.NoError(t, err, input)
		assert.Equal(t, appends, target.Profile().AppendsInput(), "input %q", input)
	}
	_, err := ParseProfile([]byte(cmd + strings.TrimSuffix(sessions(""), "\n") + "\n  input: first\n"))
	assert.ErrorContains(t, err, `input: "first"; want appended`)
	assert.True(t, Profile{Protocol: Responses}.AppendsInput())
	assert.False(t, Profile{Protocol: Chat}.AppendsInput())
}

// TestOneSourceReachesTheProfile: server.one_source says the server loads
// one agent source at a time.
func TestOneSourceReachesTheProfile(t *testing.T) {
	target, err := ParseProfile([]byte("server: {command: [x, '{addr}', '{model_url}', '{agents}'], agent: helper, one_source: true}\n"))
	require.NoError(t, err)
	assert.True(t, target.Profile().OneSource)
	target, err = ParseProfile([]byte("server: {command: [x, '{addr}', '{model_url}', '{agents}'], agent: helper}\n"))
	require.NoError(t, err)
	assert.False(t, target.Profile().OneSource)
}

// TestAgentSourceReachesTheProfile: server.agent_host and
// server.agent_definition reach the profile; the references the harness
// gives the server then name the host, with the port and the query the
// fake model serves them under, and {source} in a session API's calls is
// accepted for a server that loads an agent.
func TestAgentSourceReachesTheProfile(t *testing.T) {
	for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
		ma := ""
		if host == "::1" {
			ma = "model_addr: '[::1]:9090'\n"
		}
		def := "{providers: {p: {base_url: {model_url}}}, agents: {root: {instruction: {instruction}}}}"
		target, err := ParseProfile([]byte(agent("agent_host: '"+host+"', agent_definition: '"+def+"'") + ma + sessions(`turn: {path: '/s/{session}/agent/{source}', body: '{messages}'}`)))
		require.NoError(t, err, host)
		p := target.Profile()
		assert.Equal(t, host, p.AgentHost)
		assert.Equal(t, def, p.AgentDefinition)
		assert.True(t, p.SessionsAPI.NamesSource())
		want := "http://" + net.JoinHostPort(host, "4321") + "/agents/helper.yaml?tag=v2"
		assert.Equal(t, []string{want}, p.SourceRefs("http://127.0.0.1:4321/v1", []string{"tag=v2"}))
	}
	target, err := ParseProfile([]byte(agent("one_source: true")))
	require.NoError(t, err)
	assert.Equal(t, []string{"http://127.0.0.1:4321/agents/helper.yaml?tag=v1", "http://127.0.0.1:4321/agents/helper.yaml?tag=v3"},
		target.Profile().SourceRefs("http://127.0.0.1:4321/v1", []string{"tag=v1", "tag=v3"}), "no agent_host: the fake model's own address")
	assert.Nil(t, target.Profile().SessionsAPI)
}

// TestDockerAgentProfiles: the example profiles for docker-agent read as
// the servers they describe: serve api loads one agent source from
// localhost, in docker-agent's own format, and names it per session; serve
// chat reads its agent from a file the harness writes.
func TestDockerAgentProfiles(t *testing.T) {
	target, err := LoadProfile("../../examples/docker-agent/serve-api.yaml")
	require.NoError(t, err)
	api := target.(Subprocess).Profile()
	assert.Equal(t, Sessions, api.Protocol)
	assert.True(t, api.OneSource)
	assert.Equal(t, "localhost", api.AgentHost)
	assert.Contains(t, api.AgentDefinition, "base_url: {model_url}")
	assert.Contains(t, api.AgentDefinition, "instruction: {instruction}")
	assert.Equal(t, "/api/sessions/{session}/agent/{source}", api.SessionsAPI.Turn.Path)
	assert.Equal(t, []string{"http://localhost:4321/agents/helper.yaml?tag=v1"}, api.SourceRefs("http://127.0.0.1:4321/v1", []string{FirstSource}))

	target, err = LoadProfile("../../examples/docker-agent/serve-chat.yaml")
	require.NoError(t, err)
	chat := target.(Subprocess)
	assert.Equal(t, Chat, chat.Profile().Protocol)
	assert.Contains(t, chat.Files["agent.yaml"], "base_url: {model_url}")
	assert.Empty(t, chat.Agent, "no agent source: a file")
	assert.Equal(t, Forgets, chat.Profile().Eviction)
	assert.Equal(t, []int{1}, chat.StopStatus, "docker-agent's exit status on SIGTERM is its ordinary stop")

	_, err = ParseProfile([]byte("server:\n  command: [srv, \"{addr}\", \"{model_url}\"]\n  stop_status: [0]\n"))
	assert.ErrorContains(t, err, "server.stop_status: 0 is no exit status")
}

// TestPoliciesLeftOutAreAssumed: a profile that leaves a policy out is
// judged by its default, and the profile says which, and what else it
// could have declared.
func TestPoliciesLeftOutAreAssumed(t *testing.T) {
	target, err := ParseProfile([]byte("url: http://127.0.0.1:8080\nmodel_addr: 127.0.0.1:9090\npolicies:\n  concurrency: reject\n"))
	require.NoError(t, err)
	p := target.Profile()
	assert.NotContains(t, p.Assumed, "concurrency", "declared")
	assert.Contains(t, p.Assumed["interruption"], "rollback was assumed")
	assert.Contains(t, p.Assumed["interruption"], "keep-consistent")
	assert.Contains(t, p.Assumed["interruption"], "complete")
	assert.Contains(t, p.Assumed["eviction"], "durable was assumed")
}

// TestACPProfiles: the ACP profiles (the reference server's, docker-agent's)
// read as agents over stdio with the capabilities they advertise, and what
// an agent over stdio cannot have is refused with the field named.
func TestACPProfiles(t *testing.T) {
	target, err := LoadProfile("../../profiles/reference-acp.yaml")
	require.NoError(t, err)
	ref := target.(Subprocess)
	assert.Equal(t, ACP, ref.Profile().Protocol)
	assert.Equal(t, ACPCapabilities{ReadTextFile: true}, ref.Profile().ACPCaps)
	assert.True(t, ref.Profile().Durability.Restart)

	target, err = LoadProfile("../../examples/docker-agent/serve-acp.yaml")
	require.NoError(t, err)
	da := target.(Subprocess).Profile()
	assert.Equal(t, ACP, da.Protocol)
	assert.False(t, da.Durability.Restart || da.Durability.Crash, "it does not advertise loadSession")
	assert.True(t, da.Supersede, "a new prompt cancels the running one, by design")

	base := "protocol: acp\nserver:\n  command: [agent, \"{model_url}\"]\n"
	for extra, want := range map[string]string{
		"  ready:\n    line: ready\n": "server.ready",
		"keys: [a]\n":                 "keys",
		"conversation_header: X-C\n":  "conversation_header",
		"  replicas: 2\n":             "server.replicas",
		"acp:\n  client_capabilities:\n    terminal: true\n": "unknown field \"terminal\" in acp.client_capabilities",
	} {
		_, err := ParseProfile([]byte(base + extra))
		require.Error(t, err, extra)
		assert.Contains(t, err.Error(), want, extra)
	}
	_, err = ParseProfile([]byte("server:\n  command: [s, \"{addr}\", \"{model_url}\"]\nacp:\n  client_capabilities:\n    read_text_file: true\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "but the protocol is chat")
}

// TestResponsesSemantics: a Responses API server declares where its
// semantics differ from OpenAI's (openclaw's, below); the defaults are
// OpenAI's, and a value it does not know is an error that names the
// values, as is the section under another protocol.
func TestResponsesSemantics(t *testing.T) {
	cmd := "server: {command: [./srv, '{addr}', '{model_url}']}\nprotocol: responses\n"
	target, err := ParseProfile([]byte(cmd))
	require.NoError(t, err)
	var none *ResponsesAPI
	assert.Equal(t, none, target.Profile().ResponsesAPI)
	assert.True(t, none.Branches())
	assert.True(t, none.ChainsFromAny())
	assert.False(t, none.StoresAll())
	assert.True(t, none.IDsSurviveRestart())
	assert.Empty(t, none.Naming(), "the conversation parameter is sent only where declared")

	target, err = ParseProfile([]byte(cmd + `responses:
  chain: line
  named_by: header
  header: x-openclaw-session-key
  unknown_previous: new
  store_false: ignored
  ids_survive_restart: false
`))
	require.NoError(t, err)
	api := target.Profile().ResponsesAPI
	require.NotNil(t, api)
	assert.False(t, api.Branches())
	assert.False(t, api.ChainsFromAny())
	assert.True(t, api.StoresAll())
	assert.False(t, api.IDsSurviveRestart())
	assert.Equal(t, NamedByHeader, api.Naming())
	assert.Equal(t, "x-openclaw-session-key", api.Header)

	for yaml, want := range map[string]string{
		cmd + "responses: {chain: forest}":                                                `responses.chain: "forest"; want tree or line`,
		cmd + "responses: {named_by: cookie}":                                             `responses.named_by: "cookie"`,
		cmd + "responses: {named_by: header}":                                             "responses.header",
		cmd + "responses: {named_by: user, header: x-a}":                                  "say named_by: header",
		cmd + "responses: {unknown_previous: maybe}":                                      "responses.unknown_previous",
		cmd + "responses: {store_false: sometimes}":                                       "responses.store_false",
		cmd + "responses: {chian: line}":                                                  `unknown field "chian" in responses`,
		"server: {command: [./srv, '{addr}', '{model_url}']}\nresponses: {chain: line}\n": "the protocol is chat",
	} {
		_, err := ParseProfile([]byte(yaml))
		require.Error(t, err, yaml)
		assert.Contains(t, err.Error(), want, yaml)
	}
}

// TestOpenclawProfile: the shipped openclaw profile loads, and declares
// openclaw's documented Responses semantics.
func TestOpenclawProfile(t *testing.T) {
	target, err := LoadProfile("../../examples/openclaw/responses.yaml")
	require.NoError(t, err)
	oc := target.(Subprocess).Profile()
	require.NotNil(t, oc.ResponsesAPI)
	assert.False(t, oc.ResponsesAPI.Branches(), "previous_response_id reuses the response's session")
	assert.Equal(t, NamedByHeader, oc.ResponsesAPI.Naming())
	assert.Equal(t, "x-openclaw-session-key", oc.ResponsesAPI.Header)
	assert.False(t, oc.ResponsesAPI.ChainsFromAny())
	assert.True(t, oc.ResponsesAPI.StoresAll())
	assert.False(t, oc.ResponsesAPI.IDsSurviveRestart())
	assert.True(t, oc.Durability.Restart && oc.Durability.Crash)
	assert.Equal(t, 0.01, oc.RestartShareOrDefault(), "a restart costs a start of seconds to minutes: rationed by count")

	// Its chat endpoint: sessions named by the same header, runs queued
	// per session, a dropped turn's user message kept.
	target, err = LoadProfile("../../examples/openclaw/chat.yaml")
	require.NoError(t, err)
	chat := target.(Subprocess).Profile()
	assert.Equal(t, Chat, chat.Protocol)
	assert.Equal(t, "x-openclaw-session-key", chat.HeaderName())
	assert.Equal(t, model.Serialize, chat.Concurrency)
	assert.Equal(t, KeepConsistent, chat.Interruption)
	assert.Equal(t, 0.01, chat.RestartShareOrDefault())

	// Its ACP bridge, started with the gateway it forwards to: a prompt on
	// a busy session cancels the one running.
	target, err = LoadProfile("../../examples/openclaw/acp.yaml")
	require.NoError(t, err)
	acp := target.(Subprocess)
	assert.Equal(t, ACP, acp.Profile().Protocol)
	assert.True(t, acp.Profile().Supersede)
	assert.Equal(t, "sh", acp.Command[0])
	assert.Contains(t, acp.Command[2], "openclaw acp --url ws://127.0.0.1:{port}")
}

// TestStartTries: server.start_tries says how many times a start is
// tried; left out, a start is tried once (DefaultStartTries); fewer than
// one, or no number, is an error that names the field.
func TestStartTries(t *testing.T) {
	const server = "server:\n  command: [srv, \"{addr}\", \"{model_url}\"]\n"
	target, err := ParseProfile([]byte(server + "  start_tries: 3\n"))
	require.NoError(t, err)
	assert.Equal(t, 3, target.Profile().StartTriesOrDefault())

	target, err = ParseProfile([]byte(server))
	require.NoError(t, err)
	assert.Equal(t, DefaultStartTries, target.Profile().StartTriesOrDefault())
	assert.Equal(t, 1, DefaultStartTries)

	for _, bad := range []string{"0", "-2"} {
		_, err = ParseProfile([]byte(server + "  start_tries: " + bad + "\n"))
		assert.ErrorContains(t, err, "server.start_tries: "+bad+": want how many times a start is tried", bad)
	}
	_, err = ParseProfile([]byte(server + "  start_tries: twice\n"))
	assert.ErrorContains(t, err, "into a whole number", "a start_tries that is no number")
}

// TestEachProtocolSaysHowItRefuses: a protocol whose refusals carry no
// HTTP status (ACP, A2A) says how it refuses, and is judged by it (any
// failure before a model call refuses a request without a usable
// message); one that refuses with 400, as chat does, says nothing.
func TestEachProtocolSaysHowItRefuses(t *testing.T) {
	for _, p := range Protocols {
		switch p.Name {
		case ACP, A2A:
			assert.NotEmpty(t, p.Refusal, "%s refuses with a JSON-RPC error, not a status", p.Name)
		default:
			assert.Empty(t, p.Refusal, "%s refuses with 400", p.Name)
		}
	}
	assert.Equal(t, Chat, Protocol("").Info().Name, "the default is chat")
	assert.Contains(t, A2A.Info().Refusal, "a task rejected or failed")
}
