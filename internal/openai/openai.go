// Package openai holds the OpenAI chat-completions wire types that the
// reference server, the fake model and the harness's client all speak.
//
// Only the fields the contract in PROTOCOL.md reads are modelled; unknown
// fields in a request are ignored, as OpenAI-compatible servers do.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Roles a message may carry.
const (
	RoleSystem    = "system"
	RoleDeveloper = "developer"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Object names of responses.
const (
	ObjectCompletion = "chat.completion"
	ObjectChunk      = "chat.completion.chunk"
)

// FinishStop is the finish reason of a reply that ended normally.
const FinishStop = "stop"

// FinishToolCalls is the finish reason of an answer that asks for tool
// calls: the caller runs them and calls again with their results.
const FinishToolCalls = "tool_calls"

// TypeFunction is the type of every tool and tool call.
const TypeFunction = "function"

// DoneSentinel is the data payload that closes an SSE stream.
const DoneSentinel = "[DONE]"

// Message is one chat message. Content is always plain text: a content array
// of text parts is joined on decoding, and null decodes as "".
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
	// ToolCalls are the tool calls an assistant message asks for.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the id of the tool call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// ToolCall is one tool call an assistant message asks for.
type ToolCall struct {
	// ID names the call; the tool message with its result carries it.
	ID string `json:"id"`
	// Type is TypeFunction.
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the tool a call runs and its arguments.
type FunctionCall struct {
	Name string `json:"name"`
	// Arguments is a JSON object, as text.
	Arguments string `json:"arguments"`
}

// Tool is a tool a request offers the model.
type Tool struct {
	// Type is TypeFunction.
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function describes an offered tool.
type Function struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON schema of the tool's arguments.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ToolCallDelta is a piece of a tool call in a stream chunk: the first
// piece of a call carries its id and name, later ones (with the same
// Index) more of its arguments.
type ToolCallDelta struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function FunctionDelta `json:"function"`
}

// FunctionDelta is a piece of a tool call's function.
type FunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// Content is a message's text. It decodes from a JSON string, null, or an
// array of {"type":"text","text":...} parts, and encodes as a string.
type Content string

// UnmarshalJSON accepts the content shapes OpenAI clients send.
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = ""
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Content(s)
		return nil
	case len(b) > 0 && b[0] == '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return errors.New("content: want a string or an array of text parts")
		}
		var sb strings.Builder
		for i, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return fmt.Errorf("content part %d: only text parts are supported", i)
			}
			sb.WriteString(*p.Text)
		}
		*c = Content(sb.String())
		return nil
	default:
		return errors.New("content: want a string or an array of text parts")
	}
}

// ChatRequest is the body of POST /chat/completions.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Stream   bool      `json:"stream,omitempty"`
	// StreamOptions asks, with IncludeUsage, for a last chunk carrying
	// the token usage: some servers wait for it before they take a stream
	// as finished.
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// Tools are the tools the model may call.
	Tools []Tool `json:"tools,omitempty"`
}

// StreamOptions are a streamed request's options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Usage counts a completion's tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Completion is a chat.completion object or, with Object set to
// ObjectChunk, one chat.completion.chunk of a stream.
type Completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	// Usage is set on a whole completion, and on a stream's last chunk
	// (with no choices) when the request asked for it.
	Usage *Usage `json:"usage,omitempty"`
	// Error is set on a stream chunk that reports a failure mid-stream.
	Error *ErrorDetail `json:"error,omitempty"`
}

// Choice is one choice of a completion (Message) or of a chunk (Delta).
type Choice struct {
	Index        int      `json:"index"`
	Message      *Message `json:"message,omitempty"`
	Delta        *Delta   `json:"delta,omitempty"`
	FinishReason *string  `json:"finish_reason"`
}

// Delta is the increment a stream chunk carries.
type Delta struct {
	Role      string          `json:"role,omitempty"`
	Content   string          `json:"content,omitempty"`
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong.
type ErrorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
}

// Text returns the reply text of a non-stream completion, or the delta text
// of a chunk, from its first choice.
func (c *Completion) Text() string {
	if len(c.Choices) == 0 {
		return ""
	}
	ch := c.Choices[0]
	switch {
	case ch.Message != nil:
		return string(ch.Message.Content)
	case ch.Delta != nil:
		return ch.Delta.Content
	}
	return ""
}

// Finish returns the finish reason of the first choice, or "".
func (c *Completion) Finish() string {
	if len(c.Choices) == 0 || c.Choices[0].FinishReason == nil {
		return ""
	}
	return *c.Choices[0].FinishReason
}

// Ptr returns a pointer to s, for the optional string fields above.
func Ptr(s string) *string { return &s }
