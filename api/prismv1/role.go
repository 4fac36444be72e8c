package prismv1

// Name is the role's one name in flags, logs, metric labels and docs:
// "embedding" or "dense" ("unspecified" otherwise).
func (r Role) Name() string {
	switch r {
	case Role_ROLE_EMBEDDING:
		return "embedding"
	case Role_ROLE_DENSE:
		return "dense"
	}
	return "unspecified"
}
