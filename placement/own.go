package placement

// registerOwn adds policies of our own beyond the paper's.
func registerOwn(r *Registry) {
	r.MustRegister("FGDExact", func(o PolicyOptions) (*Policy, error) {
		return &Policy{Name: "FGDExact", Filters: []FilterPlugin{FitFilter{}}, Score: &FGDScore{Workload: o.Workload, Exact: true}}, nil
	})
}
