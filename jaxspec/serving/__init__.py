"""jaxspec.serving: continuous batching over an ``Engine`` (requests join and leave a running batch; KV pages
assigned as sequences grow through TokenSpeed's page-table kernels; nothing recompiled)."""

from jaxspec.serving.core import Request as Request
from jaxspec.serving.core import Scheduler as Scheduler
from jaxspec.serving.core import ServingEngine as ServingEngine
from jaxspec.serving.pages import PagePool as PagePool
from jaxspec.serving.request import RequestHandle as RequestHandle
from jaxspec.serving.request import RequestOutput as RequestOutput
from jaxspec.serving.request import RequestParams as RequestParams
from jaxspec.serving.request import ServingStats as ServingStats
