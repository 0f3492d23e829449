"""The serial SVM solver: kernels and kernel cache, SMO, the one-vs-one SVC estimator."""
