package targets

// ReplicaProcessURL is where replica i of srv, a server of replicas whose
// links run through the harness, listens itself: behind its proxy.
func ReplicaProcessURL(srv Server, i int) string { return srv.(*linkedReplicas).procs[i].URL() }

// ReplicasDir is the data dir the replicas of srv, a server of replicas
// whose links do not run through the harness, share.
func ReplicasDir(srv Server) string { return srv.(*replicas).dir }
