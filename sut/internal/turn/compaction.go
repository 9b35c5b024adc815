package turn

// compact runs before each model call of a stateful turn. Once the working
// copy shows the model more than CompactAfter messages (the system prompt
// not counted), it hides the tool rounds of the turns committed before this
// one: their assistant tool calls and tool results stay in the
// conversation and the store, but are no longer sent to the model. Calls
// and results go together, so what is sent keeps its pairs (T9). The
// turn's own rounds are never hidden: its model must see what it asked
// for.
//
// The marks are set on the working copy, which shares no message with the
// committed conversation (clone), and are committed only with the turn
// (t.hid): a turn that fails leaves them nowhere (T11).
func (s *Engine) compact(t *Turn) {
	if !t.Stateful {
		return
	}
	visible := 0
	for _, m := range t.Work.Messages {
		if !m.Hidden {
			visible++
		}
	}
	if visible <= s.Cfg.CompactAfter {
		return
	}
	for i, m := range t.Work.Messages[:t.Own] {
		if !m.Hidden && m.ToolPair() {
			m.Hidden = true
			t.Hid = append(t.Hid, i)
		}
	}
}
