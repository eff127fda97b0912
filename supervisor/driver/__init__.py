"""The edges that carry decisions out: the supervision loop, its actuators, step launching and signals."""
