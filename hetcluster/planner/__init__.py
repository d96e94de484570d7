"""The planner: which devices of a heterogeneous fleet should train the job (pure: numpy, pandas,
scikit-learn loaded lazily; never grpc or tensorflow).

Pipeline (estimate → solve → evaluate, each a pure function of named data):

    DeviceMeasurement, RunMeasurement, JobSpec  (inputs.py, filled by pre-training)
      → FittedModels.fit: ThroughputModel (throughput.py, contention.py, calibration.py) + PowerModel (power.py)
      → estimate(): one DataFrame row per configuration (estimate.py)
      → choose(table, objective, constraints) → Plan (choose.py); pareto_front(table)
    plan() runs the whole pipeline and switches to classes / count-vector search for big fleets
    (search.py).

The model
---------
Per device i, pre-training measures the solo throughput r_i (applied steps/s), busy power P_i and
idle power p_i. Training runs every member of S under its own device's memory plan, so each r_i
is divided by its own plan's step-time multiplier m_i (1 where plain TensorFlow fits; fleet.py),
whatever else S holds. Each r_i is the solo window revised by what
the calibration sets measured of that device, the window as a prior (solo_rates.py).

Throughput (asynchronous parameter server: every worker pulls variables, computes, pushes
gradients at its own pace, so fast workers take more steps; they all share the parameter server,
the coordinator and the links). A step costs s seconds of the shared resource, s(n) =
s·(1 + κ(n − 1)) with n workers, capacity C(n) = 1/s(n). Two families (contention.py):

    queue      closed queueing network, per-worker Bard–Schweitzer: cycle z_i = 1/r_i + s(n) − s,
               wait w_i = s(n)·(Q − Q_i), Q_i = (s(n) + w_i)/(z_i + w_i), Q = Σ Q_i,
               x_i = 1/(z_i + w_i), R(S) = Σ x_i
    waterfill  hard capacity shared max-min fairly: x_i = min(r_i, θ), Σ x_i = min(Σ r_i, C(n))

so R({i}) = r_i exactly, R ≈ Σ r_i under light load and R → C(n) under heavy load, with the fast
workers slowed most. s, κ and the family are fitted to the multi-device runs (aggregate and
per-device throughputs; BIC-weighted mixture when the runs cannot tell the variants apart), and a
ridge regression on the log-residual corrects what the family misses when at least three
multi-device runs exist and leave-one-out shows it helps (calibration.py, throughput.py).

Power: P(S) = γ·Σ_{i∈S} [p_i + (P_i − p_i)·u_i] with utilisation u_i = x_i/r_i (waiting devices
draw less), + Σ_{i∉S} p_i when idle devices count; or Σ P_i when the runs say so; γ corrects a
systematic multi-device difference.

Job: T = t_pre + (N − N_pre)/R;  E = E_pre + P·(N − N_pre)/R;  EDP = E·T.

Uncertainty: solo measurement spread propagated through the utilisations, plus the leave-one-out
relative error of the throughput (and power) model for multi-device configurations.

Which errors matter for which objective: `power` depends only on measured powers (and u_i);
`energy` without idle power mostly on the energy per step of the most efficient devices (solo
measurements); `time` and `edp` on the contention model, which is why s is fitted from runs.
"""

from hetcluster.planner.choose import Plan, SoloRate, choose, pareto_front
from hetcluster.planner.configurations import class_configurations, enumerate_configurations
from hetcluster.planner.constraints import Constraint, Deadline, Exclude, MaxEnergy, MaxPower, MemoryFit, Require
from hetcluster.planner.estimate import FittedModels, estimate
from hetcluster.planner.inputs import DeviceMeasurement, JobSpec, RunMeasurement
from hetcluster.planner.objectives import EDP, Energy, Objective, Power, Time, get_objective
from hetcluster.planner.power import PowerModel
from hetcluster.planner.search import plan
from hetcluster.planner.throughput import ThroughputModel
from hetcluster.planner.traces import load_trace, write_trace

__all__ = [
    "Constraint",
    "Deadline",
    "DeviceMeasurement",
    "EDP",
    "Energy",
    "Exclude",
    "FittedModels",
    "JobSpec",
    "MaxEnergy",
    "MaxPower",
    "MemoryFit",
    "Objective",
    "Plan",
    "Power",
    "PowerModel",
    "Require",
    "RunMeasurement",
    "SoloRate",
    "ThroughputModel",
    "Time",
    "choose",
    "class_configurations",
    "enumerate_configurations",
    "estimate",
    "get_objective",
    "load_trace",
    "pareto_front",
    "plan",
    "write_trace",
]
