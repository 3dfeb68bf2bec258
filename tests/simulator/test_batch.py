"""The persistent batch as a proposer reads it (`simulator.batch`): rows keep their slots as vLLM's `InputBatch` moves
them."""

from specrl_openrlhf.simulator.batch import BatchView
from specrl_openrlhf.simulator.requests import Request


def test_rows_keep_their_slots_as_vllms_persistent_batch_moves_them():
    view = BatchView(max_num_seqs=8, max_len=16)
    a, b, c, d, e = (Request(name, 0, [i + 1], [9]) for i, name in enumerate("abcde"))
    view.update(set(), [a, b, c, d])
    view.extend(3, [7, 8])
    view.update({"b"}, [])  # the last row moves down into the hole, its tokens with it
    assert view.req_ids == ["a", "d", "c"] and view.token_ids_cpu[1, :3].tolist() == [4, 7, 8]
    assert view.num_tokens_no_spec[1] == 3 and view.req_id_to_index == {"a": 0, "d": 1, "c": 2}
    view.update({"a", "d"}, [e])  # a new request takes the lowest free slot; the last row fills the next hole
    assert view.req_ids == ["e", "c"] and view.token_ids_cpu[0, 0] == 5 and view.token_ids_cpu[1, 0] == 3
