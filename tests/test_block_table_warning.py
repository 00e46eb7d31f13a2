"""The capacity warning of ``pack_block_table_update`` names the request: its id when the caller gives ids,
else its index in the batch and its pool row (never a placeholder)."""

import pytest

from jaxspec.kernels import block_table as bt


@pytest.mark.parametrize("ids, match", [(None, r"request 1 \(request_pool_indices\[1\] = 5\)"),
                                        (["a", "b"], "req b")])
def test_capacity_warning_names_the_request(ids, match):
    with pytest.warns(bt.PageCapacityWarning, match=match) as rec:
        bt.pack_block_table_update(4, sizes=[1, 3], begins=[0, 2], new_occupied_pages=[[7], [8, 9, 10]],
                                   request_pool_indices=[2, 5], request_ids=ids)
    assert "?" not in str(rec[0].message)
