package models

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/prism-serve/prism/internal/progress"
)

// WriteList prints the presets as a table (prism models list): tables,
// rows, width and parameters at the preset's default scale, its bytes
// there and at full size, and what it is for.
func WriteList(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFAMILY\tTABLES\tROWS\tDIM\tPARAMS\tBYTES\tFULL-SIZE BYTES\tDESCRIPTION")
	for _, name := range Presets() {
		p, _ := Lookup(name)
		c, err := p.Resolve(ScaleOptions{})
		if err != nil {
			return fmt.Errorf("preset %s: %w", name, err)
		}
		var rows int64
		for _, r := range c.TableRows {
			rows += r
		}
		e, d := c.Params()
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", name, c.Family, c.NumTables(), HumanCount(rows), c.EmbDim,
			HumanCount(e+d), progress.Bytes(c.Bytes()), progress.Bytes(p.Config.Bytes()), p.Doc)
	}
	return tw.Flush()
}

// HumanCount writes n with a k, M or G suffix ("540.68M").
func HumanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fG", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
