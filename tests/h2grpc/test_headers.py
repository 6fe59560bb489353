"""The header-block cache (epp/h2grpc/headers.py) decodes every sequence of blocks exactly as hpack alone does."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.h2grpc.headers import HeaderDecoder, leaves_table_alone

_names = st.sampled_from([":method", ":path", ":authority", "content-type", "te", "x-request-id", "x-a", "x-b"])
_values = st.sampled_from(["POST", "/p", "/envoy.service.ext_proc.v3.ExternalProcessor/Process", "epp",
                           "application/grpc", "trailers", "1", "2", "x" * 200])
_field = st.tuples(_names, _values, st.booleans())  # (name, value, sensitive: never indexed)
_block = st.tuples(st.lists(_field, min_size=1, max_size=6), st.booleans(), st.sampled_from([None, 0, 256, 4096]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_block, min_size=1, max_size=12))
def test_cached_decoding_matches_hpack(blocks):
    encoder = hpack.Encoder()
    plain = hpack.Decoder()
    cached = HeaderDecoder(1 << 20)
    for fields, huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size  # the next block starts with a size update
        block = encoder.encode(fields, huffman=huffman)
        before = (list(plain.header_table.dynamic_entries), plain.header_table_size)
        expected = [(bytes(k), bytes(v)) for k, v in plain.decode(block, raw=True)]
        unchanged = (list(plain.header_table.dynamic_entries), plain.header_table_size) == before
        assert unchanged or not leaves_table_alone(block)
        assert [(bytes(k), bytes(v)) for k, v in cached.decode(block)] == expected
        if leaves_table_alone(block):  # the same bytes again (an encoder may send them): from the cache
            assert [(bytes(k), bytes(v)) for k, v in cached.decode(block)] == expected


def test_what_changes_the_table_is_recognised():
    assert leaves_table_alone(b"\x82\x84")  # indexed fields
    assert leaves_table_alone(b"\x04\x02/p")  # literal without indexing, indexed name
    assert leaves_table_alone(b"\x10\x01a\x01b")  # never indexed, new name
    assert not leaves_table_alone(b"\x44\x02/p")  # incremental indexing
    assert not leaves_table_alone(b"\x3f\xe1\x1f")  # table size update
    assert not leaves_table_alone(b"\x04\x05/p")  # cut short
