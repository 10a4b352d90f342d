package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpulink/gpulink/controller/planner"
)

var (
	nodeScoresDesc = prometheus.NewDesc("gpulink_controller_node_scores_total",
		"Node scores computed afresh for a request shape (not kept from an earlier decision): the work of choosing nodes, "+
			"which a loaded machine does not blur as it does the time.", nil, nil)
	rankingSyncsDesc = prometheus.NewDesc("gpulink_controller_ranking_syncs_total",
		"Updates of a request shape's ranking of every node before a decision, by kind: incremental (only the nodes whose usage "+
			"changed since the shape's last decision rescored), restranded (incremental, under a new demand mix of ranking by "+
			"stranding: the other nodes ranked from their kept stranding basis), or rebuilt because the node list changed "+
			"(nodes; a shape's first decision included), the ledger no longer held the changes since (log), or ranking by "+
			"stranding started (demand).",
		[]string{"kind"}, nil)
)

// rankingCollector exports the planner's counts of ranking work
// (planner.Ranking), process-wide.
type rankingCollector struct{}

func (rankingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeScoresDesc
	ch <- rankingSyncsDesc
}

func (rankingCollector) Collect(ch chan<- prometheus.Metric) {
	c := planner.Ranking()
	ch <- prometheus.MustNewConstMetric(nodeScoresDesc, prometheus.CounterValue, float64(c.NodesScored))
	ch <- prometheus.MustNewConstMetric(rankingSyncsDesc, prometheus.CounterValue, float64(c.IncrementalSyncs), "incremental")
	ch <- prometheus.MustNewConstMetric(rankingSyncsDesc, prometheus.CounterValue, float64(c.Restranded), "restranded")
	for reason, n := range c.Builds {
		ch <- prometheus.MustNewConstMetric(rankingSyncsDesc, prometheus.CounterValue, float64(n), reason)
	}
}
