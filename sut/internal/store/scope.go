package store

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// Conversations are stored under the scope of the API key that made them.
// The store must hold nothing from which a key can be found or checked, so
// the scope is an HMAC-SHA256 of the key under a random secret of the
// store's own (created with the store, kept in it): without that secret,
// no one can test a guessed key against a stolen database, and the same
// key has unrelated scopes in two stores.
//
// Stores from before the secret used an unsalted SHA-256 of the key,
// truncated (legacyScope). Such a store gets its secret when it is first
// opened, and at every start the rows still under the legacy scope of a
// configured key move to that key's keyed scope, in one transaction: a
// data dir from before keeps its conversations, and loses its unsalted
// digests as soon as the server starts with their keys. Rows of a key not
// given at this start wait for a start that has it.

// scopePrefix marks a keyed scope, which no legacy scope (bare hex) has.
const scopePrefix = "k1:"

// KeyScope returns the scope of key under the store's secret.
func KeyScope(secret []byte, key string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	return scopePrefix + hex.EncodeToString(mac.Sum(nil)[:16])
}

// LegacyScope returns the scope a store from before the secret used for
// key.
func LegacyScope(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}
