package prismv1

import (
	"strconv"
	"strings"
)

// ShardSeqSep joins a model's name and a shard in the name of the
// shard's update sequence, "dlrm#shard2": the key of
// ListResponse.updates, and the model label of the router's update
// metrics. The router refuses model names that read as one.
const ShardSeqSep = "#shard"

// UpdateSeqKey names the update sequence of model's shard (shard < 0:
// the model's own, for a model not sharded).
func UpdateSeqKey(model string, shard int32) string {
	if shard < 0 {
		return model
	}
	return model + ShardSeqSep + strconv.Itoa(int(shard))
}

// ParseUpdateSeqKey is UpdateSeqKey's inverse (shard -1: a model's own
// sequence).
func ParseUpdateSeqKey(key string) (model string, shard int32) {
	if i := strings.LastIndex(key, ShardSeqSep); i >= 0 {
		num := key[i+len(ShardSeqSep):]
		if k, err := strconv.ParseInt(num, 10, 32); err == nil && k >= 0 && num == strconv.FormatInt(k, 10) {
			return key[:i], int32(k)
		}
	}
	return key, -1
}

// UpdateSeqKeyOf is the sequence numbering w's updates of model: its
// shard's when it announces one, else the model's.
func UpdateSeqKeyOf(w *WorkerInfo, model string) string {
	if ref := w.GetShards()[model]; ref.GetShards() > 0 && ref.GetShard() >= 0 {
		return UpdateSeqKey(model, ref.GetShard())
	}
	return model
}

// SequenceName is what ApplyUpdateRequest.sequence says: the sequence's
// key, and after an '@' the fingerprint of the sharding it numbers
// updates of, when known ("dlrm#shard2@9f3c0a1b2c3d4e5f").
func SequenceName(key, sharding string) string {
	if sharding == "" {
		return key
	}
	return key + "@" + sharding
}

// ParseSequenceName is SequenceName's inverse.
func ParseSequenceName(name string) (key, sharding string) {
	if i := strings.LastIndex(name, "@"); i >= 0 && ValidSharding(name[i+1:]) {
		return name[:i], name[i+1:]
	}
	return name, ""
}

// ValidSharding says whether fp is a sharding fingerprint: 1 to 32 hex
// digits in lower case (plan.Sharding.Fingerprint writes 16).
func ValidSharding(fp string) bool {
	if fp == "" || len(fp) > 32 {
		return false
	}
	for _, c := range fp {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// SameSharding says whether fingerprints a and b may name one sharding:
// equal, or either unknown ("": workers of earlier releases name none,
// and a sequence numbered before any worker named one).
func SameSharding(a, b string) bool { return a == b || a == "" || b == "" }

// NoSharding is what a dense worker announces (WorkerInfo.sharding) for
// a model whose plan has no sharding section: it combines no row-wise
// tables' partial pools (it refuses them), so the router must not pair
// it with a row-wise fan-out as it may one naming none (a worker of an
// earlier release). A valid fingerprint that no plan has (they are 16
// digits), it is read so by routers of every release.
const NoSharding = "0"
