"""Print the driver program's path, for spark-submit."""

from pathlib import Path

print(Path(__file__).resolve().parent / "driver.py")
