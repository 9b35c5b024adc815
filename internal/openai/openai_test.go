package openai_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
)

func TestContentDecodes(t *testing.T) {
	cases := []struct {
		name string
		json string
		want string
	}{
		{"string", `"hello tc-u1"`, "hello tc-u1"},
		{"empty string", `""`, ""},
		{"escaped string", `"a\n\"b\" \u00e9"`, "a\n\"b\" é"},
		{"null", `null`, ""},
		{"padded null", ` null `, ""},
		{"one text part", `[{"type":"text","text":"hello"}]`, "hello"},
		{"text parts are joined", `[{"type":"text","text":"hello "},{"type":"text","text":"tc-u1"},{"type":"text","text":"!"}]`, "hello tc-u1!"},
		{"empty text part", `[{"type":"text","text":""}]`, ""},
		{"no parts", `[]`, ""},
		{"unknown fields of a part are ignored", `[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]`, "x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c openai.Content
			require.NoError(t, json.Unmarshal([]byte(tc.json), &c))
			assert.Equal(t, openai.Content(tc.want), c)

			// The same inside a message.
			var m openai.Message
			require.NoError(t, json.Unmarshal([]byte(`{"role":"user","content":`+tc.json+`}`), &m))
			assert.Equal(t, openai.Content(tc.want), m.Content)
			assert.Equal(t, openai.RoleUser, m.Role)
		})
	}
}

func TestContentNullResetsEarlierValue(t *testing.T) {
	c := openai.Content("old")
	require.NoError(t, json.Unmarshal([]byte(`null`), &c))
	assert.Equal(t, openai.Content(""), c)
}

func TestContentMissingIsEmpty(t *testing.T) {
	var m openai.Message
	require.NoError(t, json.Unmarshal([]byte(`{"role":"assistant"}`), &m))
	assert.Equal(t, openai.Content(""), m.Content)
}

func TestContentRejects(t *testing.T) {
	cases := map[string]string{
		"number":              `42`,
		"negative number":     `-1.5`,
		"true":                `true`,
		"false":               `false`,
		"object":              `{"type":"text","text":"hello"}`,
		"image part":          `[{"type":"image_url","image_url":{"url":"http://127.0.0.1/x.png"}}]`,
		"text then image":     `[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]`,
		"part without text":   `[{"type":"text"}]`,
		"part with null text": `[{"type":"text","text":null}]`,
		"part without type":   `[{"text":"hello"}]`,
		"part text a number":  `[{"type":"text","text":1}]`,
		"array of strings":    `["hello"]`,
		"array with null":     `[null]`,
		"nested array":        `[[{"type":"text","text":"x"}]]`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			var c openai.Content
			assert.Error(t, json.Unmarshal([]byte(in), &c), "%s", in)

			var m openai.Message
			assert.Error(t, json.Unmarshal([]byte(`{"role":"user","content":`+in+`}`), &m), "%s", in)
		})
	}
}

func TestContentEncodesAsString(t *testing.T) {
	b, err := json.Marshal(openai.Message{Role: openai.RoleUser, Content: "hi \"tc-u1\""})
	require.NoError(t, err)
	assert.JSONEq(t, `{"role":"user","content":"hi \"tc-u1\""}`, string(b))

	// An array decodes to the joined text and encodes back as that string.
	var m openai.Message
	require.NoError(t, json.Unmarshal([]byte(`{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`), &m))
	b, err = json.Marshal(m)
	require.NoError(t, err)
	assert.JSONEq(t, `{"role":"user","content":"ab"}`, string(b))
}

func TestCompletionTextAndFinish(t *testing.T) {
	cases := []struct {
		name       string
		json       string
		text       string
		finish     string
		object     string
		wantsError bool
	}{
		{
			name:   "message",
			json:   `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"tc-a1 hi"},"finish_reason":"stop"}]}`,
			text:   "tc-a1 hi",
			finish: "stop",
			object: openai.ObjectCompletion,
		},
		{
			name:   "message with content parts",
			json:   `{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":[{"type":"text","text":"tc-a1"},{"type":"text","text":" hi"}]},"finish_reason":"length"}]}`,
			text:   "tc-a1 hi",
			finish: "length",
			object: openai.ObjectCompletion,
		},
		{
			name:   "message with null content",
			json:   `{"choices":[{"message":{"role":"assistant","content":null},"finish_reason":"tool_calls"}]}`,
			text:   "",
			finish: "tool_calls",
		},
		{
			name:   "delta",
			json:   `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" your"},"finish_reason":null}]}`,
			text:   " your",
			object: openai.ObjectChunk,
		},
		{
			name:   "role delta",
			json:   `{"object":"chat.completion.chunk","choices":[{"delta":{"role":"assistant"}}]}`,
			object: openai.ObjectChunk,
		},
		{
			name:   "final delta",
			json:   `{"object":"chat.completion.chunk","choices":[{"delta":{},"finish_reason":"stop"}]}`,
			finish: "stop",
			object: openai.ObjectChunk,
		},
		{
			name:   "no choices",
			json:   `{"object":"chat.completion.chunk","choices":[]}`,
			object: openai.ObjectChunk,
		},
		{
			name: "choices missing",
			json: `{}`,
		},
		{
			name:   "choice with neither message nor delta",
			json:   `{"choices":[{"index":0,"finish_reason":"stop"}]}`,
			finish: "stop",
		},
		{
			name:   "only the first choice counts",
			json:   `{"choices":[{"delta":{"content":"first"}},{"delta":{"content":"second"},"finish_reason":"stop"}]}`,
			text:   "first",
			finish: "",
		},
		{
			name:       "error chunk",
			json:       `{"object":"chat.completion.chunk","error":{"message":"boom","type":"server_error"},"choices":[]}`,
			object:     openai.ObjectChunk,
			wantsError: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c openai.Completion
			require.NoError(t, json.Unmarshal([]byte(tc.json), &c))
			assert.Equal(t, tc.text, c.Text())
			assert.Equal(t, tc.finish, c.Finish())
			assert.Equal(t, tc.object, c.Object)
			if tc.wantsError {
				require.NotNil(t, c.Error)
				assert.Equal(t, "boom", c.Error.Message)
				assert.Equal(t, "server_error", c.Error.Type)
			} else {
				assert.Nil(t, c.Error)
			}
		})
	}
}

func TestCompletionEncoding(t *testing.T) {
	// A chunk: finish_reason is always present (null until the end), and
	// neither message nor error appears.
	c := openai.Completion{
		ID: "x", Object: openai.ObjectChunk, Model: "m",
		Choices: []openai.Choice{{Delta: &openai.Delta{Content: "tc-a1"}}},
	}
	b, err := json.Marshal(c)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"x","object":"chat.completion.chunk","created":0,"model":"m",
		"choices":[{"index":0,"delta":{"content":"tc-a1"},"finish_reason":null}]}`, string(b))

	c.Choices[0].FinishReason = openai.Ptr(openai.FinishStop)
	c.Choices[0].Delta = &openai.Delta{}
	b, err = json.Marshal(c)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"x","object":"chat.completion.chunk","created":0,"model":"m",
		"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, string(b))
}

func TestChatRequestRoundTrip(t *testing.T) {
	for _, stream := range []bool{false, true} {
		req := openai.ChatRequest{
			Model: "gpt-fake",
			Messages: []openai.Message{
				{Role: openai.RoleSystem, Content: "be brief"},
				{Role: openai.RoleUser, Content: "hello tc-u1"},
				{Role: openai.RoleAssistant, Content: "tc-a1"},
				{Role: openai.RoleTool, Content: ""},
				{Role: openai.RoleUser, Content: "line\nbreak \"quoted\" tc-u2"},
			},
			Stream: stream,
		}
		b, err := json.Marshal(req)
		require.NoError(t, err)
		if !stream {
			assert.NotContains(t, string(b), `"stream"`, "stream is omitted when false")
		} else {
			assert.Contains(t, string(b), `"stream":true`)
		}
		var back openai.ChatRequest
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, req, back)
	}
}

func TestChatRequestDecodesClientShapes(t *testing.T) {
	var req openai.ChatRequest
	require.NoError(t, json.Unmarshal([]byte(`{
		"model": "m", "stream": true, "temperature": 0.2, "tools": [],
		"messages": [
			{"role": "system", "content": null},
			{"role": "user", "content": [{"type": "text", "text": "tc-u1"}], "name": "bob"}
		]}`), &req))
	assert.Equal(t, openai.ChatRequest{
		Model:  "m",
		Stream: true,
		Messages: []openai.Message{
			{Role: openai.RoleSystem, Content: ""},
			{Role: openai.RoleUser, Content: "tc-u1"},
		},
		Tools: []openai.Tool{},
	}, req)

	assert.Error(t, json.Unmarshal([]byte(`{"messages":[{"role":"user","content":7}]}`), &req))
}

func TestPtr(t *testing.T) {
	p := openai.Ptr("stop")
	require.NotNil(t, p)
	assert.Equal(t, "stop", *p)
	assert.NotSame(t, p, openai.Ptr("stop"))
}

func TestWriteErrorAndReadErrorMessage(t *testing.T) {
	rec := httptest.NewRecorder()
	openai.WriteError(rec, http.StatusBadGateway, "server_error", "the model failed")
	assert.Equal(t, http.StatusBadGateway, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	assert.JSONEq(t, `{"error":{"message":"the model failed","type":"server_error"}}`, rec.Body.String())

	msg, ok := openai.ReadErrorMessage(strings.NewReader(rec.Body.String()))
	assert.True(t, ok)
	assert.Equal(t, "the model failed", msg)

	msg, ok = openai.ReadErrorMessage(strings.NewReader("  upstream said no \n"))
	assert.False(t, ok)
	assert.Equal(t, "upstream said no", msg)

	msg, ok = openai.ReadErrorMessage(strings.NewReader(`{"error":{"type":"x"}}`))
	assert.False(t, ok, "an error body without a message is not read as one")
	assert.Equal(t, `{"error":{"type":"x"}}`, msg)

	msg, ok = openai.ReadErrorMessage(strings.NewReader(strings.Repeat("z", 10000)))
	assert.False(t, ok)
	assert.Equal(t, strings.Repeat("z", 200)+"...", msg)
}

func TestEncode(t *testing.T) {
	assert.JSONEq(t, `{"error":{"message":"m","type":"t"}}`,
		openai.Encode(openai.ErrorBody{Error: openai.ErrorDetail{Message: "m", Type: "t"}}))
	assert.Panics(t, func() { openai.Encode(func() {}) })
}
