"""jaxspec.serving: continuous batching over an ``Engine`` (requests join and leave a running batch; KV pages
assigned as sequences grow through TokenSpeed's page-table kernels; nothing recompiled). The scheduler
(``scheduler``) is host data in and out; the runner (``core.ServingEngine``) executes its plans with the
engine's slot API."""

from jaxspec.serving.core import ServingEngine as ServingEngine
from jaxspec.serving.request import RequestHandle as RequestHandle
from jaxspec.serving.request import RequestOutput as RequestOutput
from jaxspec.serving.request import RequestParams as RequestParams
from jaxspec.serving.request import ServingStats as ServingStats
from jaxspec.serving.scheduler import PagePool as PagePool
from jaxspec.serving.scheduler import Request as Request
from jaxspec.serving.scheduler import Scheduler as Scheduler
from jaxspec.serving.scheduler import StepPlan as StepPlan
from jaxspec.serving.scheduler import StepResult as StepResult
