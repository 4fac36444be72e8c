package server

// fixedBatches is what WorkerInfo announces for the models exported
// with a fixed batch (plan.json fixed_batch): per model, that batch, so
// that the router sends micro-batches of exactly that many candidates.
func (s *Server) fixedBatches() map[string]int64 {
	var out map[string]int64
	for name, m := range s.models {
		if fb := m.plan.FixedBatch; fb > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[name] = fb
		}
	}
	return out
}
