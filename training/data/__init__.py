"""Co-location data: load any source into one tidy frame, clean, grid, split and window it.

Pure pandas/NumPy (no TensorFlow), reusing the gateway's grid and gap rules so training sees
exactly the windows a gateway would build.
"""

from training.data.antwerp import load_antwerp
from training.data.cleaning import CleaningReport, CleaningRules, clean
from training.data.frame import CoLocationData, LoadCounts, tidy_frame
from training.data.grid import GriddedSensor, to_grid
from training.data.ispra import load_ispra
from training.data.pairs import RecordedPairs, load_pairs, read_pairs
from training.data.plain_csv import load_plain_csv
from training.data.registry import DATASET_NAMES, default_data_dir, load_dataset
from training.data.senseurcity import load_senseurcity
from training.data.split import SensorSplit, paper_split
from training.data.synthetic import generate_synthetic
from training.data.windows import WindowSet

__all__ = [
    "DATASET_NAMES",
    "CleaningReport",
    "CleaningRules",
    "CoLocationData",
    "GriddedSensor",
    "LoadCounts",
    "RecordedPairs",
    "SensorSplit",
    "WindowSet",
    "clean",
    "default_data_dir",
    "generate_synthetic",
    "load_antwerp",
    "load_dataset",
    "load_ispra",
    "load_pairs",
    "load_plain_csv",
    "load_senseurcity",
    "paper_split",
    "read_pairs",
    "tidy_frame",
    "to_grid",
]
