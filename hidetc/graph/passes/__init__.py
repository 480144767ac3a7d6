"""Graph passes: one pass per module, each `run(graph) -> Graph` (the same object when
nothing changed; `choose_layout.run` also takes the layout policy of the target). Their order
lives in one place, `hidetc.graph.pipeline`: `PASSES` (the optimizations) and
`PRECISION_PASSES` (run after them per precision: `to_float16`) and the target backends' passes.
`common` holds the helpers they share (fresh names, renaming, `Rewriter`)."""
