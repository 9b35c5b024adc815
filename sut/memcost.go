package sut

import "github.com/turncheck/turncheck/sut/internal/admission"

// conversationCost is what conversation c costs in the cache.
func conversationCost(c *conversation) int64 {
	n := int64(len(c.source))
	for _, m := range c.messages {
		n += m.size() + admission.MessageOverhead
		for _, tc := range m.ToolCalls {
			n += int64(len(tc.ID)+len(tc.Function.Name)) + admission.MessageOverhead
		}
	}
	return n
}
