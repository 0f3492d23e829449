"""Reports from results CSVs: scaling tables and fits, plots, the cost model and its calibration."""
