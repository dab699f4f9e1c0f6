"""The runs-on-disk contract: layout, identity, keys, writer, reader, lineage."""
