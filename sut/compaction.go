package sut

// compact runs before each model call of a stateful turn. Once the working
// copy shows the model more than CompactAfter messages (the system prompt
// not counted), it hides the tool rounds of the turns committed before this
// one: their assistant tool calls and tool results stay in the
// Conversation and the store, but are no longer sent to the model. Calls
// and results go together, so what is sent keeps its pairs (T9). The
// turn's own rounds are never hidden: its model must see what it asked
// for.
//
// The marks are set on the working copy, which shares no message with the
// committed conversation (clone), and are committed only with the turn
// (t.hid): a turn that fails leaves them nowhere (T11).
func (s *engine) compact(t *turn) {
	if !t.stateful {
		return
	}
	visible := 0
	for _, m := range t.work.Messages {
		if !m.Hidden {
			visible++
		}
	}
	if visible <= s.cfg.CompactAfter {
		return
	}
	for i, m := range t.work.Messages[:t.own] {
		if !m.Hidden && m.ToolPair() {
			m.Hidden = true
			t.hid = append(t.hid, i)
		}
	}
}
