package sut

import (
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// The names below are the package's own, kept where its callers know them,
// for what moved to the packages a turn travels through (internal/...).

// Gauge counts the requests a server is working on and, of those, the ones
// waiting for their conversation's turn, and signals every change; see
// admission.Gauge.
type Gauge = admission.Gauge

// RequestTagHeader is the header a harness tags a request with, so that
// the Gauge can tell it which requests the server is done with
// (Gauge.DoneWith).
const RequestTagHeader = admission.RequestTagHeader

// MaxHeaderBytes bounds a request's header block; past it net/http answers
// 431 (with a few KiB of slack of its own).
const MaxHeaderBytes = admission.MaxHeaderBytes

// MemoryShare is the share of the machine's memory a server takes for its
// budget when Config.MaxMemory is 0: a quarter.
const MemoryShare = admission.MemoryShare

// FallbackMaxMemory is the budget when the machine's memory cannot be
// read (not Linux).
const FallbackMaxMemory = admission.FallbackMaxMemory

// DefaultMaxMemory is the budget of a server whose Config.MaxMemory is 0,
// and where the figure came from, for the log; see
// admission.DefaultMaxMemory.
func DefaultMaxMemory() (int64, string) { return admission.DefaultMaxMemory() }

// DefaultMaxStoreConns is the default of Config.MaxStoreConns for a server
// that works on at most maxRequests turns at once; see
// Store.DefaultMaxStoreConns.
func DefaultMaxStoreConns(maxRequests int) int { return store.DefaultMaxStoreConns(maxRequests) }

// ConnectionOfLife is the application_name of the one connection to
// PostgreSQL each server on a shared store keeps all its life, and says
// it is alive on (its beats), as pg_stat_activity shows it; see
// store.Leases.
const ConnectionOfLife = store.LifeName
