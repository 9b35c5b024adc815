package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// A step's title says what was sent in its own protocol: each invalid
// continuation an A2A or ACP client draws is named by what its one
// message carries on the wire (no content, or one blank text), and two
// shapes never send the same thing under two names.
func TestShapesNamedAsSent(t *testing.T) {
	prev := openai.Message{Role: openai.RoleUser, Content: "Please remember tc-u1."}
	for _, p := range []targets.Protocol{targets.A2A, targets.ACP} {
		shapes := plan.Shapes(p, false)
		require.Len(t, shapes, map[targets.Protocol]int{targets.A2A: 3, targets.ACP: 2}[p], "%s", p)
		for i, shape := range shapes {
			msgs := shape.Build(prev, i)
			if shape.NamesTask {
				// A2A's follow-up to a task that ended: that task's
				// message again, naming the task.
				require.Equal(t, targets.A2A, p)
				assert.Contains(t, shape.Name, "finished task")
				assert.Equal(t, []openai.Message{prev}, msgs)
				continue
			}
			var texts []string
			if p == targets.A2A {
				for _, part := range messageParts(msgs) {
					texts = append(texts, part.Text)
				}
			} else {
				for _, b := range promptBlocks(msgs) {
					texts = append(texts, blockText(b))
				}
			}
			switch {
			case strings.Contains(shape.Name, "without"):
				assert.Empty(t, texts, "%s: %q sends content", p, shape.Name)
			case strings.Contains(shape.Name, "blank"):
				require.Len(t, texts, 1, "%s: %q", p, shape.Name)
				assert.Empty(t, strings.TrimSpace(texts[0]), "%s: %q sends text", p, shape.Name)
			default:
				t.Errorf("%s: %q names neither form", p, shape.Name)
			}
		}
	}
	// Chat's shapes are chat's: a list of messages, each named by its last.
	assert.Equal(t, plan.InvalidShapes[0].Name, plan.Shapes(targets.Chat, false)[0].Name)
	assert.Equal(t, plan.AppendedShapes[0].Name, plan.Shapes(targets.Sessions, true)[0].Name)
}
