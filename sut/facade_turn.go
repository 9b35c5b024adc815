package sut

import "github.com/turncheck/turncheck/sut/internal/turn"

// Bounds on the fields of a chat request. They hold whatever the body
// limit: a field the server copies (the model name goes into every stream
// chunk) must not turn a small body into a large response.
const (
	// MaxModelBytes bounds the request's "model".
	MaxModelBytes = turn.MaxModelBytes
	// MaxContentBytes bounds the text of each message of a request.
	MaxContentBytes = turn.MaxContentBytes
	// MaxMessages bounds the messages of one request (a stateless request
	// carries its whole history).
	MaxMessages = turn.MaxMessages
	// MaxConversationIDBytes bounds a conversation id.
	MaxConversationIDBytes = turn.MaxConversationIDBytes
)

// MaxToolRounds bounds the tool rounds of one turn: a model that asks for
// tools once more fails the turn (502), as a model that asks forever would
// otherwise hold its conversation for good.
const MaxToolRounds = turn.MaxToolRounds

// The built-in tools the server offers the model on every call of a turn.
// Their results are deterministic functions of their arguments, so that a
// harness can tell every result from the call it answers.
const (
	// ToolEcho answers its "text" argument.
	ToolEcho = turn.ToolEcho
	// ToolLookup answers the body of GET {model-url}/tools/lookup?key=KEY:
	// a tool whose run the model provider sees, so that a harness can tell
	// when, and whether, it started.
	ToolLookup = turn.ToolLookup
)
