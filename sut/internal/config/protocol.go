package config

// Protocol is a client protocol through which a turn reaches the server.
// Every protocol runs its turns through the same machinery (run): the
// same locks, store, tool loop and interruption policy. Only how a request
// names its history, and how the answer is written, differ.
type Protocol string

// The client protocols; their names are those of MutantInfo.Protocol.
const (
	// ProtoChat is POST /v1/chat/completions (server.go).
	ProtoChat Protocol = ""
	// ProtoResponses is POST /v1/responses (responses.go).
	ProtoResponses Protocol = "responses"
	// ProtoSessions is the sessions API, POST /api/sessions (sessions.go).
	ProtoSessions Protocol = "sessions"
	// ProtoACP is the Agent Client Protocol over stdio (acp.go).
	ProtoACP Protocol = "acp"
	// ProtoA2A is the Agent2Agent protocol, JSON-RPC over HTTP (a2a).
	ProtoA2A Protocol = "a2a"
)
