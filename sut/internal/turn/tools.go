package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// The built-in tools the server offers the model on every call of a turn.
// Their results are deterministic functions of their arguments, so that a
// harness can tell every result from the call it answers.
const (
	// ToolEcho answers its "text" argument.
	ToolEcho = "echo"
	// ToolLookup answers the body of GET {model-url}/tools/lookup?key=KEY:
	// a tool whose run the model provider sees, so that a harness can tell
	// when, and whether, it started.
	ToolLookup = "lookup"
)

// maxLookupBytes bounds the body of a lookup.
const maxLookupBytes = 64 << 10

// toolResultError prefixes a result that reports a failed tool run. Real
// agents tell the model a tool failed in its result, and the loop goes on.
const toolResultError = "error: "

// offeredTools are the tools every model call offers.
var offeredTools = []openai.Tool{
	{Type: openai.TypeFunction, Function: openai.Function{
		Name:        ToolEcho,
		Description: "Answers the given text unchanged.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`),
	}},
	{Type: openai.TypeFunction, Function: openai.Function{
		Name:        ToolLookup,
		Description: "Looks up the value stored under a key.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"],"additionalProperties":false}`),
	}},
}

// toolbox runs the built-in tools.
type toolbox struct {
	lookupURL string // {model-url}/tools/lookup
	client    *http.Client
	// deadlines and timeout bound each lookup, as they bound each model
	// call: a lookup that does not answer is a failed tool, not a hung
	// turn.
	deadlines config.Deadlines
	timeout   time.Duration
}

func newToolbox(modelURL *url.URL, client *http.Client, deadlines config.Deadlines, timeout time.Duration) *toolbox {
	return &toolbox{lookupURL: modelURL.JoinPath("tools/lookup").String(), client: client, deadlines: deadlines, timeout: timeout}
}

// Run runs call and returns its result. A tool that fails, or a call that
// names no tool or carries bad arguments, gets a result that starts with
// "error: ": the model hears of it and the loop goes on. The only error is
// ctx's end, which is no tool failure but the turn's interruption.
func (tb *toolbox) Run(ctx context.Context, call openai.ToolCall) (string, error) {
	switch call.Function.Name {
	case ToolEcho:
		var args struct {
			Text *string `json:"text"`
		}
		if err := decodeArgs(call.Function.Arguments, &args); err != nil || args.Text == nil {
			return toolResultError + `echo wants arguments {"text": string}`, nil
		}
		return *args.Text, nil
	case ToolLookup:
		var args struct {
			Key *string `json:"key"`
		}
		if err := decodeArgs(call.Function.Arguments, &args); err != nil || args.Key == nil {
			return toolResultError + `lookup wants arguments {"key": string}`, nil
		}
		return tb.lookup(ctx, *args.Key)
	}
	return fmt.Sprintf("%sno tool named %.64q (the tools are %s and %s)", toolResultError, call.Function.Name, ToolEcho, ToolLookup), nil
}

// decodeArgs decodes a tool call's arguments: one JSON object with no
// field but v's.
func decodeArgs(args string, v any) error {
	dec := json.NewDecoder(strings.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the arguments")
	}
	return nil
}

// lookup asks the model provider for key's value.
func (tb *toolbox) lookup(ctx context.Context, key string) (string, error) {
	runCtx, cancel := tb.deadlines.WithTimeout(ctx, tb.timeout)
	defer cancel()
	// Failed is the result of a failed lookup, unless the turn was
	// interrupted meanwhile: then there is no result at all.
	failed := func(format string, args ...any) (string, error) {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		return toolResultError + fmt.Sprintf(format, args...), nil
	}
	req, err := http.NewRequestWithContext(runCtx, http.MethodGet, tb.lookupURL+"?key="+url.QueryEscape(key), nil)
	if err != nil {
		return failed("lookup failed: %v", err)
	}
	resp, err := tb.client.Do(req)
	if err != nil {
		if runCtx.Err() != nil && ctx.Err() == nil {
			return failed("lookup timed out after %s", tb.timeout)
		}
		return failed("lookup failed: %s", netReason(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLookupBytes+1))
	switch {
	case err != nil && runCtx.Err() != nil && ctx.Err() == nil:
		return failed("lookup timed out after %s", tb.timeout)
	case err != nil:
		return failed("lookup failed: %s", netReason(err))
	case resp.StatusCode != http.StatusOK:
		return failed("lookup answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	case len(body) > maxLookupBytes:
		return failed("lookup answered over %d bytes", maxLookupBytes)
	}
	return string(bytes.ToValidUTF8(body, []byte("\uFFFD"))), nil
}
