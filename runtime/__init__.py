"""Runtime: engines, scheduling and the cost model that times them."""
