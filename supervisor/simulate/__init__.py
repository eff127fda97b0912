"""``supervise simulate``: a discrete-event simulation of a long campaign driven by a failure trace.

trace.py makes or reads the trace; evidence.py turns each fault into the evidence the supervisor would hold (the
only place that knows how faults look); engine.py runs the campaign three ways (naive Slurm requeue, this
supervisor through the real classify/policy/ledger code, the Young/Daly optimum) and accounts every second.
"""
