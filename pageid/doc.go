// Package pageid is pd3's page vocabulary, a leaf every layer shares: the
// page size, the 8-byte page key (volume | page number) and the errors
// that say what is wrong with a page reference or with stored pages. The
// memory node, the page cache, Host View and the frontends all use these
// values, so each condition is recognised by one sentinel wherever it
// arose: a frontend's error mapper checks pageid.ErrOutOfRange, whether
// the page cache or the memory node found the page past the end.
package pageid
