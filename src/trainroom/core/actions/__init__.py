"""The keeper's actions as objects: one module per action (its spec, typed arguments,
precondition, plan, target and execution), a base that carries any of them through plan ->
confirm -> execute, and the registry every client reads (`registry.REGISTRY`). The ops/ modules
remain the execution engines; an action only plans and calls them."""
