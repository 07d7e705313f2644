"""Layer 0: the case, the one visibility rule, the float64 reference, the paged batch, intervals
and status, the errors users see, mode resolution. Imports nothing else of the package.
"""
