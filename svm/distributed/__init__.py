"""Distributed SVMs built on the serial solver: Dis-SMO, Cascade, DC-SVM, CP-SVM, CA-SVM."""
