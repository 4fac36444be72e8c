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
