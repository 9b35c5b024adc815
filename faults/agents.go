package faults

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// AgentPlaceholders are the placeholders of an agent definition template
// (ModelConfig.AgentDefinition), each replaced by a JSON string, which
// YAML reads as a double-quoted scalar: "{model_url}" is the model's base
// URL (ending in /v1), "{name}" the agent's name from the path, "{query}"
// the raw query the definition was fetched with, and "{instruction}" the
// instruction the model's own definition carries ("You are NAME, loaded
// from /agents/NAME.yaml?QUERY."), so that a server that loads the agent
// under a changed query shows it to the model.
var AgentPlaceholders = []string{"{model_url}", "{name}", "{query}", "{instruction}"}

// placeholderLike matches what reads as a placeholder in a template, known
// or not: a misspelt one must be refused, not served to the server as is.
var placeholderLike = regexp.MustCompile(`\{[A-Za-z_][A-Za-z0-9_]*\}`)

// CheckAgentDefinition says what is wrong with an agent definition
// template, nil if nothing: it must not be blank, and every placeholder in
// it must be one of AgentPlaceholders.
func CheckAgentDefinition(template string) error {
	if strings.TrimSpace(template) == "" {
		return errors.New("empty: give the definition the server reads, with {model_url} where it calls the model")
	}
	for _, p := range placeholderLike.FindAllString(template, -1) {
		if !slices.Contains(AgentPlaceholders, p) {
			return fmt.Errorf("unknown placeholder %s (known: %s)", p, strings.Join(AgentPlaceholders, ", "))
		}
	}
	return nil
}

// agentInstruction is the instruction of agent name fetched with query:
// it names the query, so that a changed one reaches the model.
func agentInstruction(name, query string) string {
	from := "/agents/" + name + ".yaml"
	if query != "" {
		from += "?" + query
	}
	return "You are " + name + ", loaded from " + from + "."
}

// agentText fills in an agent definition template (see AgentPlaceholders)
// in one pass, so that a value holding a placeholder's text (a query can
// hold anything) is never replaced again.
func agentText(template, modelURL, name, query string) string {
	values := map[string]string{"{model_url}": modelURL, "{name}": name, "{query}": query,
		"{instruction}": agentInstruction(name, query)}
	pairs := make([]string, 0, 2*len(values))
	for k, v := range values {
		pairs = append(pairs, k, jsonString(v))
	}
	return strings.NewReplacer(pairs...).Replace(template)
}

// jsonString is s as a JSON string, without HTML escapes: a YAML reader
// takes it as a double-quoted scalar, and a JSON reader as a string.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
