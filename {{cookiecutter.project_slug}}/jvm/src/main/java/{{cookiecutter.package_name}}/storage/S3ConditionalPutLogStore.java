package {{ cookiecutter.package_name }}.storage;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.UUID;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log store for S3 (s3a://) that is safe with more than one writing process.
 *
 * <p>Delta commits version N of a table by creating {@code _delta_log/N.json} only if it does not
 * exist; that "only if" is the whole of its concurrency control. Delta's default store for S3
 * ({@code S3SingleDriverLogStore}) checks for the file and then uploads it: two processes that
 * commit the same version both pass the check, the later upload replaces the earlier, and a
 * committed transaction (with its data files and its txnAppId/txnVersion tag) disappears. Hadoop's
 * S3A (3.4.2 and later) can instead make the upload itself conditional: a PUT with
 * {@code If-None-Match: *}, which the store refuses with 412 when the key exists. This store writes
 * every new commit that way, so exactly one of two racing writers wins and the other sees the
 * {@link FileAlreadyExistsException} on which Delta re-reads the log and retries or fails its
 * transaction as a conflict.
 *
 * <p>An upload whose answer is lost (a timeout after the server stored it, retried by the SDK and
 * then refused because the key now exists) would look like a lost race. Each upload therefore
 * carries a unique id in its object metadata; on a failure the store reads the id back, and its
 * own id means the commit is in.
 *
 * <p>Files written with overwrite (Delta's {@code _last_checkpoint}) are plain uploads, as in
 * Delta's own stores. Listing is S3's, which is strongly consistent (AWS since December 2020;
 * S3-compatible stores must be too, and must honour {@code If-None-Match}).
 *
 * <p>Example:: {@code spark.delta.logStore.s3a.impl=<this class>} with the jar on {@code spark.jars}.
 */
public class S3ConditionalPutLogStore extends HadoopFileSystemLogStore {

  /** The createFile option that turns an upload into a put-if-absent (HADOOP-19256). */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  /** Object metadata set on the upload (S3A sends it as x-amz-meta-delta-commit-writer). */
  static final String WRITER_HEADER_OPTION = "fs.s3a.create.header.delta-commit-writer";

  /** The same metadata read back, as S3A exposes it. */
  static final String WRITER_ATTRIBUTE = "header.delta-commit-writer";

  public S3ConditionalPutLogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        writeActions(out, actions);
      }
      return;
    }
    String writer = UUID.randomUUID().toString();
    // createFile's builder is a raw type in Hadoop's API: build() answers Object.
    FSDataOutputStream out =
        (FSDataOutputStream)
            fs.createFile(path)
                .create()
                .overwrite(false)
                .must(CONDITIONAL_CREATE, true)
                .must(WRITER_HEADER_OPTION, writer)
                .build();
    try {
      writeActions(out, actions);
    } catch (IOException | RuntimeException failure) {
      // Nothing is uploaded before close: abort so that a half-written commit is never sent.
      out.abort();
      throw failure;
    }
    try {
      out.close();
    } catch (IOException failure) {
      String holder = writerOf(fs, path);
      if (writer.equals(holder)) {
        return; // our upload landed; only its answer was lost
      }
      if (holder != null) {
        FileAlreadyExistsException lost = new FileAlreadyExistsException(path.toString());
        lost.initCause(failure);
        throw lost;
      }
      throw failure;
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    // An S3 object appears whole at the end of its upload, or not at all.
    return false;
  }

  private static void writeActions(FSDataOutputStream out, Iterator<String> actions)
      throws IOException {
    while (actions.hasNext()) {
      out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
    }
  }

  /** The writer id on the object at path: "" when it has none, null when there is no object. */
  private static String writerOf(FileSystem fs, Path path) throws IOException {
    if (!fs.exists(path)) {
      return null;
    }
    boolean tagged = fs.listXAttrs(path).stream().anyMatch(WRITER_ATTRIBUTE::equals);
    if (!tagged) {
      return "";
    }
    byte[] value = fs.getXAttr(path, WRITER_ATTRIBUTE);
    return value == null ? "" : new String(value, StandardCharsets.UTF_8).trim();
  }
}
