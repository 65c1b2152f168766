import { render, screen } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { Artifact } from '../types'
import { ArtifactList } from './ArtifactList'

const artifact = (id: number, name: string, files: string[] | null): Artifact => ({
  id, job_id: 12, kind: files ? 'adapter' : 'gguf', name, size_bytes: 2048, verification: null,
  created_at: '2026-12-02T12:00:00Z', files,
})

describe('ArtifactList', () => {
  it('offers a folder artifact whole as a tar stream, and a single file as it is', () => {
    render(<ArtifactList artifacts={[artifact(3, 'adapter', ['adapter_config.json']), artifact(4, 'model.gguf', null)]}
      finished />)
    const folder = screen.getByRole('link', { name: /^Download folder \(\.tar\)/ })
    expect(folder).toHaveAttribute('href', '/api/artifacts/3/download?archive=tar')
    expect(screen.getByRole('link', { name: 'adapter_config.json' }))
      .toHaveAttribute('href', '/api/artifacts/3/download?file=adapter_config.json')
    expect(screen.getByRole('link', { name: /^Download\s*model\.gguf/ })).toHaveAttribute('href', '/api/artifacts/4/download')
    expect(screen.getAllByRole('link', { name: /\.tar/ })).toHaveLength(1)
  })
})
