# The kernels of a book build (`make book` points IPYTHONDIR at book/ipython): they talk to
# sphinx over loopback only, so ipykernel's start-up warning about unencrypted TCP says nothing
# a reader of the build log can act on; warnings below ERROR are not printed.
c = get_config()  # noqa: F821
c.IPKernelApp.log_level = "ERROR"
