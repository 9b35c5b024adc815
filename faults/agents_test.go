package faults_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/faults"
)

// serverFormat is an agent definition in a format of a server's own (the
// shape of docker-agent's), read back as the server would.
type serverFormat struct {
	Agents    map[string]struct{ Model, Instruction string } `yaml:"agents"`
	Providers map[string]struct {
		BaseURL string `yaml:"base_url"`
	} `yaml:"providers"`
	Name  string `yaml:"name"`
	Query string `yaml:"query"`
}

// TestServesTheProfilesAgentDefinition: with a template, GET
// /agents/NAME.yaml serves it with the model's URL, the name, the query and
// the instruction filled in as strings a YAML reader takes whole: a query
// with YAML syntax or a placeholder's text in it is quoted, not read, and
// not replaced again.
func TestServesTheProfilesAgentDefinition(t *testing.T) {
	template := `agents:
  root:
    model: main
    instruction: {instruction}
providers:
  fake:
    base_url: {model_url}
name: {name}
query: {query}
`
	f := start(t, faults.ModelConfig{AgentDefinition: template})
	for _, tc := range []struct{ path, name, query string }{
		{"/agents/helper.yaml?tag=v1", "helper", "tag=v1"},
		{"/v1/agents/helper.yaml?tag=v2", "helper", "tag=v2"},
		{"/agents/helper.yaml", "helper", ""},
		{`/agents/q.yaml?a="b":%20c%0A{name}#frag`, "q", `a="b":%20c%0A{name}`},
		{`/agents/q.yaml?'[x={query}`, "q", `'[x={query}`},
	} {
		resp, body := f.send(http.MethodGet, tc.path, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, tc.path)
		var got serverFormat
		dec := yaml.NewDecoder(bytes.NewReader(body))
		dec.KnownFields(true)
		require.NoError(t, dec.Decode(&got), "%s", body)
		assert.Equal(t, f.m.URL(), got.Providers["fake"].BaseURL, tc.path)
		assert.Equal(t, tc.name, got.Name, tc.path)
		assert.Equal(t, tc.query, got.Query, tc.path)
		from := "/agents/" + tc.name + ".yaml"
		if tc.query != "" {
			from += "?" + tc.query
		}
		assert.Equal(t, "You are "+tc.name+", loaded from "+from+".", got.Agents["root"].Instruction, tc.path)
		assert.Equal(t, "main", got.Agents["root"].Model, "the template's own text is served as is")
	}
	assert.Equal(t, 0, f.m.CallCount(), "an agent definition is not a model call")
}

// TestCheckAgentDefinition: a blank template, or one with a placeholder
// the model does not fill in, is refused, naming the placeholder.
func TestCheckAgentDefinition(t *testing.T) {
	assert.NoError(t, faults.CheckAgentDefinition("base_url: {model_url}\ninstruction: {instruction}\n"))
	assert.NoError(t, faults.CheckAgentDefinition("m: {a: b}\n"), "a YAML flow mapping is no placeholder")
	assert.ErrorContains(t, faults.CheckAgentDefinition(" \n"), "empty")
	err := faults.CheckAgentDefinition("base_url: {modelurl}\n")
	assert.ErrorContains(t, err, "unknown placeholder {modelurl}")
	assert.ErrorContains(t, err, "{model_url}, {name}, {query}, {instruction}")
}
