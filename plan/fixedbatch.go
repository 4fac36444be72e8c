package plan

// DenseFixedBatch is the batch dense.onnx runs at only: FixedBatch when
// a node that keeps the graph at it runs on the dense side (a blocker
// with side gpu), else 0 (dense.onnx takes any batch, whatever the
// embedding tier's parts need). The dense tier then runs such a model's
// requests one at a time, each of exactly that many samples.
func (p *Plan) DenseFixedBatch() int64 {
	if p.FixedBatch <= 0 || p.Batch == nil {
		return 0
	}
	for _, b := range p.Batch.Blockers {
		if b.Side == GPU {
			return p.FixedBatch
		}
	}
	return 0
}
