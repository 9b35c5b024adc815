package execute

import (
	"slices"
	"sync"
)

// AuxInstructions are the instructions (model.Call.Prompt) of the model
// calls a server was seen to make beside its turns (a title, a summary):
// learned where a turn's answer named its own call, and used where none
// did, so that a turn whose client left after only such a call is not
// judged by it (model.Turn.SplitAuxiliary). What a server's auxiliary
// calls look like is the server's, not a check's: one set serves every
// session of a run, its shrinking and its replays. Safe for concurrent
// use.
type AuxInstructions struct {
	mu    sync.Mutex
	known map[uint32]bool
}

// NewAuxInstructions returns the set of the instructions given (a saved
// failure's).
func NewAuxInstructions(prompts []uint32) *AuxInstructions {
	a := &AuxInstructions{}
	a.add(prompts)
	return a
}

// has reports whether prompt is an auxiliary call's.
func (a *AuxInstructions) has(prompt uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.known[prompt]
}

// add learns prompts.
func (a *AuxInstructions) add(prompts []uint32) {
	if len(prompts) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known == nil {
		a.known = map[uint32]bool{}
	}
	for _, p := range prompts {
		a.known[p] = true
	}
}

// List is the instructions learned, in order.
func (a *AuxInstructions) List() []uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]uint32, 0, len(a.known))
	for p := range a.known {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
