package store

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are the store's hot-path counters: atomics added once per
// table per batch, not per row.
type counters struct {
	lookups, rows, errors        atomic.Int64
	hotHits, hotMisses           atomic.Int64
	pebbleReads, pebbleBytes     atomic.Int64
	upserts, upsertRows          atomic.Int64
	upsertNanos, lastUpsertNanos atomic.Int64
	copies, copiedRows           atomic.Int64
	carriedRows                  atomic.Int64
	missNanos, blockReadNanos    atomic.Int64
	lookupNanos, gatherNanos     atomic.Int64
	finishNanos                  atomic.Int64
	blockReadBytes               atomic.Int64
	// directReads is shared with the table files (dropBehindFS).
	directReads *atomic.Int64
	// corruptions is shared with Pebble's event listener
	// (reportCorruption).
	corruptions *atomic.Int64
}

// Metrics is a snapshot of the store's counters.
type Metrics struct {
	// Lookups is successful Lookup calls; Rows the ids they resolved;
	// Errors the calls refused (bad input or store failure).
	Lookups, Rows, Errors int64
	// HotHits and HotMisses count ids served from the hot tier or not.
	HotHits, HotMisses int64
	// PebbleReads is rows read from Pebble (a batch's duplicates once);
	// PebbleBytes their stored bytes.
	PebbleReads, PebbleBytes int64
	// MissReadNanos is the wall time lookups spent reading misses from
	// Pebble; BlockReadNanos the time Pebble's iterators spent reading
	// blocks the block cache did not hold (summed over concurrent
	// readers, so it may exceed MissReadNanos), and BlockReadBytes those
	// blocks' bytes. Point reads (MissPoint) add to MissReadNanos only.
	MissReadNanos, BlockReadNanos, BlockReadBytes int64
	// LookupNanos is the wall time of successful Lookup calls, in three
	// phases: GatherNanos copying hot rows and sorting the misses,
	// MissReadNanos (above) reading them, FinishNanos offering them to
	// the hot tier and pooling.
	LookupNanos, GatherNanos, FinishNanos int64
	// DirectReads is the table file reads served with O_DIRECT
	// (Options.DirectReads), past the page cache.
	DirectReads int64
	// Corruptions is the reads that found a damaged block in the
	// store's files (a checksum that does not match, a truncated file);
	// the log names each file once.
	Corruptions int64
	// HotRestoredRows is the rows a warm restart read back into the hot
	// tier (Options.WarmRestart).
	HotRestoredRows int64
	// ScrubbedBytes is the table file bytes Scrub has checked;
	// LastScrub when its last whole pass ended (zero: none).
	ScrubbedBytes int64
	LastScrub     time.Time
	// Upserts is acknowledged Upsert calls; UpsertRows their rows.
	Upserts, UpsertRows int64
	// UpsertLagNanos is the summed time from an Upsert call to its ack
	// (durable and visible); LastUpsertLagNanos the latest one.
	UpsertLagNanos, LastUpsertLagNanos int64
	// TableCopies is shared tables copied before their first update
	// (copy-on-write), CopiedRows their rows; CarriedRows is updated rows
	// a version switch wrote into the newly active tables.
	TableCopies, CopiedRows, CarriedRows int64
	// The hot tier: its size and policy decisions.
	HotBytes                                   int64
	HotSlots, HotUsed                          int64
	HotAdmissions, HotRejections, HotEvictions int64
	// Pebble's block cache. BlockCacheMaxBytes is its capacity:
	// Options.CacheBytes plus the two memtables Pebble reserves against
	// it, whose room blocks take while the memtables are not full (a
	// store that takes no upserts).
	BlockCacheHits, BlockCacheMisses, BlockCacheBytes, BlockCacheMaxBytes int64
	// DiskAvailBytes and DiskTotalBytes are the free space (to this
	// process) and the size of the store's disk, when its file system
	// says (DiskKnown): at too little free, updates are refused
	// (ErrDiskFull), and an operator wants to know before.
	DiskAvailBytes, DiskTotalBytes int64
	DiskKnown                      bool
}

// HitRatio is HotHits / (HotHits + HotMisses).
func (m Metrics) HitRatio() float64 {
	if t := m.HotHits + m.HotMisses; t > 0 {
		return float64(m.HotHits) / float64(t)
	}
	return 0
}

// Metrics returns the counters now.
func (s *Store) Metrics() Metrics {
	v := s.view.Load()
	hs := v.tier.Stats()
	m := Metrics{
		Lookups: s.m.lookups.Load(), Rows: s.m.rows.Load(), Errors: s.m.errors.Load(),
		HotHits: s.m.hotHits.Load(), HotMisses: s.m.hotMisses.Load(),
		PebbleReads: s.m.pebbleReads.Load(), PebbleBytes: s.m.pebbleBytes.Load(),
		MissReadNanos: s.m.missNanos.Load(), BlockReadNanos: s.m.blockReadNanos.Load(), BlockReadBytes: s.m.blockReadBytes.Load(),
		LookupNanos: s.m.lookupNanos.Load(), GatherNanos: s.m.gatherNanos.Load(), FinishNanos: s.m.finishNanos.Load(),
		DirectReads: s.m.directReads.Load(), Corruptions: s.m.corruptions.Load(), HotRestoredRows: s.warm.rows.Load(),
		ScrubbedBytes: s.scrubbed.Load(),
		Upserts:       s.m.upserts.Load(), UpsertRows: s.m.upsertRows.Load(),
		UpsertLagNanos: s.m.upsertNanos.Load(), LastUpsertLagNanos: s.m.lastUpsertNanos.Load(),
		TableCopies: s.m.copies.Load(), CopiedRows: s.m.copiedRows.Load(), CarriedRows: s.m.carriedRows.Load(),
		HotBytes: v.tier.Budget(), HotSlots: hs.Slots, HotUsed: hs.Used,
		HotAdmissions: hs.Admissions, HotRejections: hs.Rejections, HotEvictions: hs.Evictions,
	}
	if t := s.lastScrub.Load(); t != 0 {
		m.LastScrub = time.Unix(0, t)
	}
	if !s.closed.Load() {
		bc := s.db.Metrics().BlockCache
		m.BlockCacheHits, m.BlockCacheMisses, m.BlockCacheBytes = bc.Hits, bc.Misses, bc.Size
		m.BlockCacheMaxBytes = s.popts.Cache.MaxSize()
	}
	if u, err := s.popts.FS.GetDiskUsage(s.dir); err == nil {
		m.DiskAvailBytes, m.DiskTotalBytes, m.DiskKnown = int64(u.AvailBytes), int64(u.TotalBytes), true
	}
	return m
}

// Collector exposes a store's Metrics to Prometheus.
type Collector struct {
	s     *Store
	descs []metricDesc
}

type metricDesc struct {
	d     *prometheus.Desc
	kind  prometheus.ValueType
	value func(Metrics) float64
	// disk: reported only when the file system says its usage.
	disk bool
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector for s (register it with a
// prometheus.Registry).
func NewCollector(s *Store) *Collector {
	c := &Collector{s: s}
	add := func(name, help string, kind prometheus.ValueType, f func(Metrics) float64) {
		c.descs = append(c.descs, metricDesc{d: prometheus.NewDesc("prism_store_"+name, help, nil, nil), kind: kind, value: f})
	}
	ctr, gauge := prometheus.CounterValue, prometheus.GaugeValue
	add("lookups_total", "Lookup calls served.", ctr, func(m Metrics) float64 { return float64(m.Lookups) })
	add("lookup_rows_total", "Ids looked up.", ctr, func(m Metrics) float64 { return float64(m.Rows) })
	add("lookup_errors_total", "Lookup calls refused.", ctr, func(m Metrics) float64 { return float64(m.Errors) })
	add("hot_hits_total", "Ids served by the hot tier.", ctr, func(m Metrics) float64 { return float64(m.HotHits) })
	add("hot_misses_total", "Ids the hot tier did not hold.", ctr, func(m Metrics) float64 { return float64(m.HotMisses) })
	add("hot_hit_ratio", "Hot tier hits / lookups since start.", gauge, func(m Metrics) float64 { return m.HitRatio() })
	add("hot_bytes", "Hot tier budget in bytes.", gauge, func(m Metrics) float64 { return float64(m.HotBytes) })
	add("hot_rows", "Rows resident in the hot tier.", gauge, func(m Metrics) float64 { return float64(m.HotUsed) })
	add("hot_admissions_total", "Rows admitted to the hot tier.", ctr, func(m Metrics) float64 { return float64(m.HotAdmissions) })
	add("hot_rejections_total", "Rows the admission filter turned away.", ctr, func(m Metrics) float64 { return float64(m.HotRejections) })
	add("hot_evictions_total", "Rows evicted from the hot tier.", ctr, func(m Metrics) float64 { return float64(m.HotEvictions) })
	add("pebble_reads_total", "Rows read from Pebble.", ctr, func(m Metrics) float64 { return float64(m.PebbleReads) })
	add("pebble_read_bytes_total", "Bytes of rows read from Pebble.", ctr, func(m Metrics) float64 { return float64(m.PebbleBytes) })
	add("lookup_seconds_total", "Wall time of successful lookups (gather, miss read and finish phases).", ctr, func(m Metrics) float64 { return float64(m.LookupNanos) / 1e9 })
	add("lookup_gather_seconds_total", "Wall time lookups spent copying hot-tier rows and sorting the misses.", ctr, func(m Metrics) float64 { return float64(m.GatherNanos) / 1e9 })
	add("lookup_finish_seconds_total", "Wall time lookups spent offering read rows to the hot tier and pooling.", ctr, func(m Metrics) float64 { return float64(m.FinishNanos) / 1e9 })
	add("miss_read_seconds_total", "Wall time lookups spent reading hot-tier misses from Pebble.", ctr, func(m Metrics) float64 { return float64(m.MissReadNanos) / 1e9 })
	add("block_read_seconds_total", "Time Pebble iterators of lookups spent reading blocks not in the block cache (summed over concurrent readers).", ctr, func(m Metrics) float64 { return float64(m.BlockReadNanos) / 1e9 })
	add("block_read_bytes_total", "Bytes of the blocks lookups read from files.", ctr, func(m Metrics) float64 { return float64(m.BlockReadBytes) })
	add("corrupt_reads_total", "Reads that found a damaged block in the store's files (the log names each file once); the store must be replaced.", ctr, func(m Metrics) float64 { return float64(m.Corruptions) })
	add("scrubbed_bytes_total", "Table file bytes the background scrub (serve embedding --scrub-every) read and checked against their checksums.", ctr, func(m Metrics) float64 { return float64(m.ScrubbedBytes) })
	add("last_scrub_timestamp_seconds", "When the scrub last read every block of the store (0: not since start).", gauge, func(m Metrics) float64 {
		if m.LastScrub.IsZero() {
			return 0
		}
		return float64(m.LastScrub.UnixNano()) / 1e9
	})
	add("direct_reads_total", "Table file reads served with O_DIRECT, past the page cache.", ctr, func(m Metrics) float64 { return float64(m.DirectReads) })
	add("hot_restored_rows_total", "Rows a warm restart read back into the hot tier.", ctr, func(m Metrics) float64 { return float64(m.HotRestoredRows) })
	add("block_cache_hits_total", "Pebble block cache hits.", ctr, func(m Metrics) float64 { return float64(m.BlockCacheHits) })
	add("block_cache_misses_total", "Pebble block cache misses.", ctr, func(m Metrics) float64 { return float64(m.BlockCacheMisses) })
	add("upserts_total", "Upserts acknowledged.", ctr, func(m Metrics) float64 { return float64(m.Upserts) })
	add("upsert_rows_total", "Rows upserted.", ctr, func(m Metrics) float64 { return float64(m.UpsertRows) })
	add("upsert_lag_seconds_total", "Summed time from upsert call to durable, visible ack.", ctr, func(m Metrics) float64 { return float64(m.UpsertLagNanos) / 1e9 })
	add("upsert_last_lag_seconds", "The latest upsert's time to ack.", gauge, func(m Metrics) float64 { return float64(m.LastUpsertLagNanos) / 1e9 })
	add("table_copies_total", "Shared tables copied before their first update.", ctr, func(m Metrics) float64 { return float64(m.TableCopies) })
	add("table_copied_rows_total", "Rows of the shared tables copied.", ctr, func(m Metrics) float64 { return float64(m.CopiedRows) })
	add("carried_rows_total", "Updated rows a version switch wrote into the newly active tables.", ctr, func(m Metrics) float64 { return float64(m.CarriedRows) })
	add("disk_available_bytes", "Free bytes on the store's disk (to this process); below the memtable's size and an update's bytes, updates are refused.", gauge, func(m Metrics) float64 { return float64(m.DiskAvailBytes) })
	c.descs[len(c.descs)-1].disk = true
	add("disk_size_bytes", "Size of the store's disk in bytes.", gauge, func(m Metrics) float64 { return float64(m.DiskTotalBytes) })
	c.descs[len(c.descs)-1].disk = true
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.Metrics()
	for _, d := range c.descs {
		if d.disk && !m.DiskKnown {
			continue
		}
		ch <- prometheus.MustNewConstMetric(d.d, d.kind, d.value(m))
	}
}
