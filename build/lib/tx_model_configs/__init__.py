"""The architecture fields of real published config.json files, one JSON file a model.

Data only: `tx_part4.shipped_configs()` reads them (Part 8). Each file names its source in
`_source`; installed with the package, so that a notebook finds them in Colab too."""
