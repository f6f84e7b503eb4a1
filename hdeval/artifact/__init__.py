"""The artifact directory, whatever the method: layout, manifest, checksums, safe loading."""
