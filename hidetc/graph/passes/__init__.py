"""Graph passes: one pass per module, each `run(graph) -> Graph` (the same object when
nothing changed). Their order lives in one place: `hidetc.graph.pipeline.PASSES`.
`common` holds the helpers they share (fresh names, renaming, `Rewriter`)."""
