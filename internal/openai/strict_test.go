package openai_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
)

// goTypes matches what encoding/json's errors say of Go types.
var goTypes = regexp.MustCompile(`Go (struct|value)|struct \{|openai\.|\[\]|json: |unmarshal`)

func TestDecodeChatRequestAccepts(t *testing.T) {
	req, err := openai.DecodeChatRequest([]byte(`{
		"model": "m", "stream": true, "temperature": 0.2, "tools": [{"a": {"a": 1}}], "stream_options": {"include_usage": true},
		"messages": [
			{"role": "system", "content": null},
			{"role": "user", "content": [{"type": "text", "text": "tc-u1 "}, {"type": "text", "text": "é"}], "name": "bob"},
			{"role": "assistant"},
			{"role": "user", "content": "tc-u2", "content_extra": {"content": 1}}
		]} `))
	require.NoError(t, err)
	assert.Equal(t, &openai.ChatRequest{
		Model:  "m",
		Stream: true,
		Messages: []openai.Message{
			{Role: openai.RoleSystem},
			{Role: openai.RoleUser, Content: "tc-u1 é"},
			{Role: openai.RoleAssistant},
			{Role: openai.RoleUser, Content: "tc-u2"},
		},
	}, req)

	req, err = openai.DecodeChatRequest([]byte(`{"messages":[],"model":null,"stream":null}`))
	require.NoError(t, err)
	assert.Equal(t, &openai.ChatRequest{Messages: []openai.Message{}}, req)
}

func TestDecodeChatRequestRefuses(t *testing.T) {
	for name, body := range map[string]string{
		"empty":                    ``,
		"white space":              "  \n",
		"not JSON":                 `hello`,
		"array":                    `[]`,
		"null":                     `null`,
		"string":                   `"x"`,
		"unterminated":             `{"messages":[]`,
		"trailing object":          `{"messages":[]}{}`,
		"trailing closer":          `{"messages":[]}}`,
		"trailing bracket":         `{"messages":[]}]`,
		"no messages":              `{"model":"m"}`,
		"null messages":            `{"messages":null}`,
		"messages a string":        `{"messages":"x"}`,
		"message a string":         `{"messages":["x"]}`,
		"message null":             `{"messages":[null]}`,
		"role a number":            `{"messages":[{"role":1}]}`,
		"content a number":         `{"messages":[{"role":"user","content":1}]}`,
		"content an object":        `{"messages":[{"role":"user","content":{}}]}`,
		"image part":               `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`,
		"part without text":        `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		"part text null":           `{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
		"part a string":            `{"messages":[{"role":"user","content":["x"]}]}`,
		"model a number":           `{"model":1,"messages":[]}`,
		"stream a string":          `{"stream":"yes","messages":[]}`,
		"MESSAGES":                 `{"MESSAGES":[]}`,
		"Model":                    `{"Model":"m","messages":[]}`,
		"STREAM beside stream":     `{"stream":false,"STREAM":true,"messages":[]}`,
		"stream with a long s":     `{"ſtream":true,"messages":[]}`,
		"Stream_Options":           `{"Stream_Options":{},"messages":[]}`,
		"Role":                     `{"messages":[{"Role":"user"}]}`,
		"Content":                  `{"messages":[{"role":"user","Content":"x"}]}`,
		"Type":                     `{"messages":[{"role":"user","content":[{"Type":"text","text":"x"}]}]}`,
		"TEXT":                     `{"messages":[{"role":"user","content":[{"type":"text","TEXT":"x"}]}]}`,
		"duplicate messages":       `{"messages":[],"messages":[]}`,
		"duplicate escaped key":    `{"messages":[],"m\u0065ssages":[]}`,
		"duplicate role":           `{"messages":[{"role":"user","role":"system"}]}`,
		"duplicate deep":           `{"messages":[],"x":[[{"k":1,"k":1}]]}`,
		"duplicate unknown":        `{"messages":[],"x":1,"x":2}`,
		"invalid UTF-8 in a value": "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
		"invalid UTF-8 in a key":   "{\"messages\":[],\"\xc3\x28\":1}",
		"too deep":                 `{"messages":[],"x":` + strings.Repeat("[", openai.MaxRequestDepth) + strings.Repeat("]", openai.MaxRequestDepth) + `}`,
		"number too large":         `{"model":1e999,"messages":[]}`,
		"byte order mark":          "\ufeff" + `{"messages":[]}`,
	} {
		t.Run(name, func(t *testing.T) {
			req, err := openai.DecodeChatRequest([]byte(body))
			require.Error(t, err)
			assert.Nil(t, req)
			assert.NotRegexp(t, goTypes, err.Error())
		})
	}
}

// TestDecodeChatRequestDepth: the depth bound is exact.
func TestDecodeChatRequestDepth(t *testing.T) {
	d := openai.MaxRequestDepth - 1 // the top-level object is one level
	_, err := openai.DecodeChatRequest([]byte(`{"messages":[],"x":` + strings.Repeat("[", d) + strings.Repeat("]", d) + `}`))
	assert.NoError(t, err)
	_, err = openai.DecodeChatRequest([]byte(`{"messages":[],"x":` + strings.Repeat(`{"a":`, d) + `1` + strings.Repeat("}", d) + `}`))
	assert.NoError(t, err)
}

// FuzzDecodeChatRequest: the strict decoder never panics, never speaks of
// Go types, and never disagrees with encoding/json on a body both accept:
// being strict only refuses more. What it accepts round-trips.
//
// Run with: go test ./internal/openai/ -run XXX -fuzz FuzzDecodeChatRequest -fuzztime 1m
func FuzzDecodeChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"tc-u1"}],"stream":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"messages":[{"role":"user","content":null}],"model":null,"stream":null}`,
		`{"MESSAGES":[{"role":"user","content":"x"}]}`,
		`{"messages":[],"messages":[{"role":"user","content":"x"}]}`,
		`{"messages":[{"role":"user","content":"x","Content":"y"}]}`,
		`{"messages":[],"ſtream":true}`,
		`{"messages":[],"x":[[[[{"a":{"a":{"a":1,"a":2}}}]]]]}`,
		`{"messages":[]} `,
		`{"messages":[]}}`,
		`{"messages":[{"role":"user","content":"\ud800 \u0000"}]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
		`{"model":1e999,"messages":[]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x","TYPE":"text"}]}]}`,
		strings.Repeat("[", 100),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := openai.DecodeChatRequest(body)
		if err != nil {
			if goTypes.MatchString(err.Error()) {
				t.Fatalf("error speaks of Go types: %v", err)
			}
			return
		}
		var lenient openai.ChatRequest
		if json.Unmarshal(body, &lenient) == nil {
			lenient.StreamOptions = nil // not read by the strict decoder
			if !assert.ObjectsAreEqual(&lenient, req) {
				t.Fatalf("strict and encoding/json disagree on %q:\nstrict  %+v\nlenient %+v", body, req, lenient)
			}
		}
		back, err := openai.DecodeChatRequest([]byte(openai.Encode(req)))
		if err != nil {
			t.Fatalf("its own encoding is refused: %v", err)
		}
		if !assert.ObjectsAreEqual(req, back) {
			t.Fatalf("round trip changed %+v into %+v", req, back)
		}
	})
}

// TestDecodeStrict: the one reading of every body refuses, as a
// StrictError for the client, what DecodeChatRequest's JSON checks refuse,
// whatever v is; a body that is fine JSON but not what v wants is
// encoding/json's error, for the caller to word.
func TestDecodeStrict(t *testing.T) {
	for name, body := range map[string]string{
		"duplicate top":   `{"a":1,"a":2}`,
		"duplicate deep":  `[{"x":[{"k":1,"k":2}]}]`,
		"escaped twin":    `{"a":1,"\u0061":2}`,
		"invalid UTF-8":   "{\"a\":\"\xff\"}",
		"data after":      `{"a":1} {}`,
		"empty":           ``,
		"nested too deep": strings.Repeat("[", openai.MaxRequestDepth+1) + strings.Repeat("]", openai.MaxRequestDepth+1),
	} {
		var v any
		var strict *openai.StrictError
		require.ErrorAs(t, openai.DecodeStrict([]byte(body), &v), &strict, name)
	}
	var obj map[string]int
	require.NoError(t, openai.DecodeStrict([]byte(`{"a":1,"b":2}`), &obj))
	require.Equal(t, map[string]int{"a": 1, "b": 2}, obj)
	err := openai.DecodeStrict([]byte(`[1]`), &obj)
	var strict *openai.StrictError
	require.Error(t, err)
	require.False(t, errors.As(err, &strict), "well-formed JSON of another shape: %v", err)
}
