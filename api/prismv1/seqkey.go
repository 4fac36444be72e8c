package prismv1

import (
	"strconv"
	"strings"
)

// ShardSeqSep joins a model's name and a shard in the name of the
// shard's update sequence, "dlrm#shard2@9f3c0a1b2c3d4e5f" (the sharding's
// fingerprint after the '@'; none from workers of earlier releases): the
// key of ListResponse.updates and ApplyUpdateRequest.sequence, and the
// model label of the router's update metrics. The router refuses model
// names that read as one.
const ShardSeqSep = "#shard"

// UpdateSeqKey names the update sequence of model's shard of the
// sharding fingerprinted sharding (shard < 0: the model's own, for a
// model not sharded).
func UpdateSeqKey(model string, shard int32, sharding string) string {
	if shard < 0 {
		return model
	}
	key := model + ShardSeqSep + strconv.Itoa(int(shard))
	if sharding != "" {
		key += "@" + sharding
	}
	return key
}

// ParseUpdateSeqKey is UpdateSeqKey's inverse (shard -1: a model's own
// sequence).
func ParseUpdateSeqKey(key string) (model string, shard int32, sharding string) {
	i := strings.LastIndex(key, ShardSeqSep)
	if i < 0 {
		return key, -1, ""
	}
	num, fp, _ := strings.Cut(key[i+len(ShardSeqSep):], "@")
	k, err := strconv.ParseInt(num, 10, 32)
	if err != nil || k < 0 || num != strconv.FormatInt(k, 10) || (strings.Contains(key[i:], "@") && !ValidSharding(fp)) {
		return key, -1, ""
	}
	return key[:i], int32(k), fp
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

// UpdateSeqKeyOf is the sequence numbering w's updates of model: its
// shard's when it announces one, else the model's.
func UpdateSeqKeyOf(w *WorkerInfo, model string) string {
	if ref := w.GetShards()[model]; ref.GetShards() > 0 && ref.GetShard() >= 0 {
		return UpdateSeqKey(model, ref.GetShard(), ref.GetSharding())
	}
	return model
}
