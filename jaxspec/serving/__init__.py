"""jaxspec.serving: continuous batching over an ``Engine`` (requests join and leave a running batch; KV pages
assigned as sequences grow through TokenSpeed's page-table kernels; nothing recompiled)."""

from jaxspec.serving.core import Request as Request
from jaxspec.serving.core import RequestOutput as RequestOutput
from jaxspec.serving.core import Scheduler as Scheduler
from jaxspec.serving.core import ServingEngine as ServingEngine
from jaxspec.serving.pages import PagePool as PagePool
