package main

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/internal/modelrun"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
)

func init() { subcommands = append(subcommands, newScoreCmd) }

type scoreFlags struct {
	samples   int
	criteo    string
	batch     int
	threads   int
	seed      uint64
	zipf      float64
	show      int
	scoresOut string
	warmup    int
}

func newScoreCmd() *cobra.Command {
	var f scoreFlags
	cmd := &cobra.Command{
		Use:   "score MODEL.onnx [--samples N | --criteo FILE] [--batch B]",
		Short: "Score samples with the whole model in one ONNX Runtime session (the monolithic reference and baseline)",
		Long: `score runs the whole model in one ONNX Runtime session, on synthetic
samples (Zipf ids, seeded) or on Criteo rows, and prints the first scores and
a throughput summary. Every later correctness check compares against it and
every performance figure is a ratio against it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runScore(cmd.OutOrStdout(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.samples, "samples", 1024, "synthetic samples to score (ignored with --criteo)")
	fl.StringVar(&f.criteo, "criteo", "", "score rows of this Criteo file (TSV, or CSV/TSV with a header)")
	fl.IntVar(&f.batch, "batch", 256, "samples per ONNX Runtime run")
	fl.IntVar(&f.threads, "threads", 1, "ONNX Runtime intra-op threads (0: one per core)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic samples")
	fl.Float64Var(&f.zipf, "zipf", 1.05, "Zipf exponent of synthetic ids")
	fl.IntVar(&f.show, "show", 5, "print the first N scores")
	fl.StringVar(&f.scoresOut, "scores-out", "", "write every score to this file, one per line")
	fl.IntVar(&f.warmup, "warmup", 3, "untimed batches run first")
	return cmd
}

func runScore(stdout io.Writer, path string, f scoreFlags) error {
	if f.batch <= 0 {
		return errors.New("score: --batch must be positive")
	}
	if f.samples <= 0 && f.criteo == "" {
		return errors.New("score: --samples must be positive")
	}
	if f.threads < 0 {
		return errors.New("score: --threads must not be negative")
	}
	meta, err := pb.ReadModel(path, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	sig, err := models.InferSignature(meta)
	if err != nil {
		return fmt.Errorf("score %q: %w", path, err)
	}
	// Draw every batch before timing, so the figure is ONNX Runtime's.
	var batches []*models.Batch
	var labels []float32
	if f.criteo != "" {
		file, err := os.Open(f.criteo)
		if err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer file.Close()
		src, err := models.NewCriteo(bufio.NewReader(file), f.criteo, sig)
		if err != nil {
			return err
		}
		for {
			b, err := src.Next(f.batch)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			labels = append(labels, src.Labels()...)
			batches = append(batches, b)
		}
	} else {
		src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: f.seed, ZipfS: f.zipf})
		if err != nil {
			return err
		}
		for left := f.samples; left > 0; left -= f.batch {
			b, _ := src.Next(min(left, f.batch))
			batches = append(batches, b)
		}
	}
	sess, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: f.threads})
	if err != nil {
		return err
	}
	defer sess.Close()
	outIdx := 0
	if i := slices.Index(sess.OutputNames(), models.ScoreOutput); i >= 0 {
		outIdx = i
	}
	for i := 0; i < f.warmup && len(batches) > 0; i++ {
		if _, err := sess.Run(modelrun.Inputs(batches[i%len(batches)])); err != nil {
			return err
		}
	}
	var scores []float32
	lat := make([]time.Duration, 0, len(batches))
	start := time.Now()
	for _, b := range batches {
		t0 := time.Now()
		out, err := sess.Run(modelrun.Inputs(b))
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
		scores = append(scores, out[outIdx]...)
	}
	wall := time.Since(start)

	for i := 0; i < f.show && i < len(scores); i++ {
		if labels != nil {
			fmt.Fprintf(stdout, "sample %d: score %.6f label %g\n", i, scores[i], labels[i])
		} else {
			fmt.Fprintf(stdout, "sample %d: score %.6f\n", i, scores[i])
		}
	}
	if f.scoresOut != "" {
		if err := writeScores(f.scoresOut, scores); err != nil {
			return err
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	threads := fmt.Sprint(f.threads)
	if f.threads == 0 {
		threads = "auto"
	}
	fmt.Fprintf(stdout, "scored %d samples in %d batches of up to %d, threads=%s: %.0f samples/s; batch latency p50 %s p99 %s\n",
		len(scores), len(batches), f.batch, threads, float64(len(scores))/wall.Seconds(), pct(0.5), pct(0.99))
	if labels != nil {
		fmt.Fprintf(stdout, "log loss on %d labelled rows: %.4f\n", len(labels), logLoss(scores, labels))
	}
	return nil
}

func writeScores(path string, scores []float32) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write scores: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, s := range scores {
		fmt.Fprintf(w, "%.8g\n", s)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write scores %q: %w", path, err)
	}
	return f.Close()
}

func logLoss(p, y []float32) float64 {
	var s float64
	for i := range y {
		q := min(max(float64(p[i]), 1e-7), 1-1e-7)
		if y[i] > 0.5 {
			s -= math.Log(q)
		} else {
			s -= math.Log(1 - q)
		}
	}
	return s / float64(len(y))
}
