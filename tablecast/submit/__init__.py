"""spark-submit's driver program for an App (YARN, Kubernetes, any cluster manager).

``python -m tablecast.submit`` prints the path of :mod:`tablecast.submit.driver`,
the file to give spark-submit as its application::

    spark-submit --master yarn --deploy-mode cluster --jars "$JARS" \\
        "$(python -m tablecast.submit)" app.py --bootstrap-servers B --checkpoint-dir hdfs:///…

The driver does what ``tablecast run APP.py [options]`` does, with the master,
the driver's address and the jars as spark-submit set them. (The file lives in
a package of its own: spark-submit runs it as a script, with its directory
first on ``sys.path``, where no module may shadow a standard one.)
"""
