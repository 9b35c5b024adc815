package store

import "github.com/turncheck/turncheck/sut/internal/admission"

// conversationCost is what conversation c costs in the cache.
func conversationCost(c *Conversation) int64 {
	n := int64(len(c.Source))
	for _, m := range c.Messages {
		n += m.Size() + admission.MessageOverhead
		for _, tc := range m.ToolCalls {
			n += int64(len(tc.ID)+len(tc.Function.Name)) + admission.MessageOverhead
		}
	}
	return n
}
