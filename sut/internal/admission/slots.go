package admission

import "sync/atomic"

// requestSlots bounds the turn requests a server works on at once, counted
// from the moment their body is in: each may hold a model connection, a
// reply of up to maxReplyBytes, and a conversation's history. Requests
// still sending their body are bounded by the connection cap and the body
// deadline instead, so that slow senders cannot take the slots of turns.
type requestSlots struct {
	// Max is how many slots there are.
	Max  int64
	used atomic.Int64
}

// take takes a slot, or reports that all are taken.
func (rs *requestSlots) take() bool {
	if rs.used.Add(1) > rs.Max {
		rs.used.Add(-1)
		return false
	}
	return true
}

func (rs *requestSlots) give() { rs.used.Add(-1) }
